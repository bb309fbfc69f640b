//! How long a simulated pod's containers run and how they exit, in the spirit of kwok's
//! Stage API (`kwok/stages/pod-general.yaml`: a pod owned by a Job completes; everything
//! else runs until deleted).
//!
//! The plan of a pod is decided once, when the simulated kubelet starts it, by the first
//! of these that applies:
//!
//! 1. the pod's own annotations, [`RUN_DURATION_ANNOTATION`] (`30s`, `forever`) and
//!    [`EXIT_CODE_ANNOTATION`];
//! 2. the [`RunRule`]s of [`SimConfig::run_rules`](crate::SimConfig::run_rules), in order:
//!    the first whose [`RunSelector`] matches;
//! 3. the defaults ([`default_plan`]): a pod that is meant to end — owned by a Job, a Helm
//!    test hook (`helm.sh/hook: test`), or a bare pod with `restartPolicy: Never` or
//!    `OnFailure` given a command (`kubectl run --restart=Never … -- true`) — ends as its
//!    command would (`true`, `false`, `exit 3`, `sleep 5`, `sh -c "…; exit 2"`; any other
//!    command succeeds after [`SimConfig::default_run_duration`](crate::SimConfig));
//!    every other pod (servers: `restartPolicy: Always`, the default) runs until deleted.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Pod annotation: how long the pod's containers run before they exit (`30`, `30s`,
/// `500ms`, `2m`, `1h`; `forever` to keep them running whatever the rules say).
pub const RUN_DURATION_ANNOTATION: &str = "sim.ccm-rs.io/run-duration";
/// Pod annotation: the exit code of the containers when they exit (default 0).
pub const EXIT_CODE_ANNOTATION: &str = "sim.ccm-rs.io/exit-code";
/// Helm's hook annotation; `test` (and Helm 2's `test-success`/`test-failure`) marks the
/// pods `helm test` runs and waits for.
pub const HELM_HOOK_ANNOTATION: &str = "helm.sh/hook";

/// What a started pod's containers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunPlan {
    /// They run until the pod is deleted (a server).
    Forever,
    /// They exit after `after` with `code`.
    Exit {
        /// How long they run.
        after: Duration,
        /// Their exit code (0: `Completed`, otherwise `Error`).
        code: i32,
    },
}

/// Which pods a [`RunRule`] applies to: every field given must match (an empty selector
/// matches every pod).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSelector {
    /// Image patterns (`*` matches any run of characters, e.g. `*/nginx:*`); matches when
    /// any container's image matches any pattern.
    pub images: Vec<String>,
    /// Command patterns matched against the program (the first word, without its
    /// directory) of any container's command, or of its args when it has no command
    /// (`kubectl run … -- true`).
    pub commands: Vec<String>,
    /// Labels the pod must have, with these values (`*`: any value).
    pub labels: BTreeMap<String, String>,
    /// Annotations the pod must have, with these values (`*`: any value).
    pub annotations: BTreeMap<String, String>,
    /// Kinds of which the pod must have an owner (`Job`, `ReplicaSet`, …).
    pub owner_kinds: Vec<String>,
    /// Restart policies the pod must have (`Always`, `OnFailure`, `Never`).
    pub restart_policies: Vec<String>,
}

/// A rule deciding the [`RunPlan`] of the pods its selector matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRule {
    /// The rule's name, for logs.
    pub name: String,
    /// The pods it applies to.
    pub selector: RunSelector,
    /// What their containers do.
    pub plan: RunPlan,
}

/// `*`-glob match (no other metacharacters).
fn glob(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if s.len() < first.len() + last.len() || !s.starts_with(first) || !s.ends_with(last) {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

/// The argv of each container: its command then its args (the image's entrypoint is
/// unknown, so a container with args only runs them, as `kubectl run -- true` means).
fn argvs(pod: &Pod) -> Vec<Vec<String>> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let mut argv = c.command.clone().unwrap_or_default();
            argv.extend(c.args.clone().unwrap_or_default());
            argv
        })
        .collect()
}

fn program(argv: &[String]) -> Option<&str> {
    argv.first().map(|p| p.rsplit('/').next().unwrap_or(p))
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

fn map_matches(want: &BTreeMap<String, String>, have: &BTreeMap<String, String>) -> bool {
    want.iter()
        .all(|(k, v)| have.get(k).is_some_and(|h| v == "*" || h == v))
}

impl RunSelector {
    /// Whether the selector matches `pod`.
    pub fn matches(&self, pod: &Pod) -> bool {
        let images = || {
            pod.spec
                .as_ref()
                .map(|s| s.containers.as_slice())
                .unwrap_or_default()
                .iter()
                .filter_map(|c| c.image.as_deref())
        };
        (self.images.is_empty() || images().any(|i| self.images.iter().any(|p| glob(p, i))))
            && (self.commands.is_empty()
                || argvs(pod)
                    .iter()
                    .filter_map(|a| program(a))
                    .any(|prog| self.commands.iter().any(|p| glob(p, prog))))
            && map_matches(&self.labels, pod.labels())
            && map_matches(&self.annotations, pod.annotations())
            && (self.owner_kinds.is_empty()
                || pod
                    .owner_references()
                    .iter()
                    .any(|o| self.owner_kinds.contains(&o.kind)))
            && (self.restart_policies.is_empty()
                || self
                    .restart_policies
                    .iter()
                    .any(|p| p == restart_policy(pod)))
    }
}

/// Parses a run duration: seconds, or a number with `ms`, `s`, `m` or `h`.
pub fn parse_run_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = number
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

/// The plan the pod's annotations ask for, if any (a malformed duration is logged and
/// ignored).
fn annotated_plan(pod: &Pod) -> Option<RunPlan> {
    let annotations = pod.annotations();
    let raw = annotations.get(RUN_DURATION_ANNOTATION)?.trim();
    if matches!(raw, "forever" | "infinity") {
        return Some(RunPlan::Forever);
    }
    let Some(after) = parse_run_duration(raw) else {
        tracing::warn!(pod = %pod.name_any(), value = %raw, "ignoring malformed {RUN_DURATION_ANNOTATION}");
        return None;
    };
    let code = annotations
        .get(EXIT_CODE_ANNOTATION)
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    Some(RunPlan::Exit { after, code })
}

/// What a shell-like command line does: the time its `sleep`s add up to and the exit code
/// of its last command (or of `exit N`); `None` when it never ends (`sleep infinity`, a
/// `while true` loop, `tail -f`).
fn interpret(argv: &[String], default_run: Duration) -> Option<(Duration, i32)> {
    let Some(prog) = program(argv) else {
        return Some((default_run, 0));
    };
    if matches!(prog, "sh" | "bash" | "ash" | "dash" | "zsh") {
        let script = argv
            .iter()
            .position(|a| a == "-c")
            .and_then(|i| argv.get(i + 1));
        let Some(script) = script else {
            // A shell with no script exits at once when it has no terminal.
            return Some((default_run, 0));
        };
        return interpret_script(script, default_run);
    }
    let (mut run, mut code) = (Duration::ZERO, 0);
    if !step(argv, &mut run, &mut code)? {
        return Some((run, code));
    }
    Some((if run.is_zero() { default_run } else { run }, code))
}

/// One simple command: adds its run time and sets the exit code. `Some(false)` when it
/// ends the script (`exit`), `None` when it never ends.
fn step(words: &[String], run: &mut Duration, code: &mut i32) -> Option<bool> {
    let Some(prog) = program(words) else {
        return Some(true);
    };
    match prog {
        "sleep" => {
            let arg = words.get(1).map(String::as_str).unwrap_or("0");
            if arg == "infinity" {
                return None;
            }
            *run += parse_run_duration(arg).unwrap_or(Duration::ZERO);
            *code = 0;
        }
        "exit" => {
            *code = words.get(1).and_then(|c| c.parse().ok()).unwrap_or(*code);
            return Some(false);
        }
        "false" => *code = 1,
        "tail" if words.iter().any(|w| w == "-f" || w == "-F") => return None,
        "while" | "until" => return None,
        _ => *code = 0,
    }
    Some(true)
}

fn interpret_script(script: &str, default_run: Duration) -> Option<(Duration, i32)> {
    let (mut run, mut code) = (Duration::ZERO, 0);
    for part in script.split([';', '\n']) {
        // `a && b`: b runs only if a succeeded; `a || b`: only if it failed.
        let mut last_op = "";
        for (i, piece) in part.split("&&").enumerate() {
            for (j, cmd) in piece.split("||").enumerate() {
                let op = if j > 0 {
                    "||"
                } else if i > 0 {
                    "&&"
                } else {
                    last_op
                };
                if (op == "&&" && code != 0) || (op == "||" && code == 0) {
                    continue;
                }
                let words: Vec<String> = cmd.split_whitespace().map(str::to_owned).collect();
                if !step(&words, &mut run, &mut code)? {
                    return Some((run, code));
                }
                last_op = op;
            }
        }
    }
    Some((if run.is_zero() { default_run } else { run }, code))
}

/// Whether the pod is one that is meant to end: owned by a Job, a Helm test hook, or a
/// bare pod with `restartPolicy` `Never`/`OnFailure` given a command.
fn meant_to_end(pod: &Pod) -> bool {
    let job_owned = pod.owner_references().iter().any(|o| o.kind == "Job");
    let helm_test = pod
        .annotations()
        .get(HELM_HOOK_ANNOTATION)
        .is_some_and(|h| {
            h.split(',')
                .any(|h| matches!(h.trim(), "test" | "test-success" | "test-failure"))
        });
    let has_command = argvs(pod).iter().any(|a| !a.is_empty());
    job_owned || helm_test || (restart_policy(pod) != "Always" && has_command)
}

/// The built-in plan (step 3 of the order [`plan`] follows: annotations, then rules, then this).
pub fn default_plan(pod: &Pod, default_run: Duration) -> RunPlan {
    if !meant_to_end(pod) {
        return RunPlan::Forever;
    }
    // The pod ends when its last container does, with the first failure's code.
    let mut longest = Duration::ZERO;
    let mut failed = 0;
    for argv in argvs(pod) {
        let Some((run, code)) = interpret(&argv, default_run) else {
            return RunPlan::Forever;
        };
        longest = longest.max(run);
        if failed == 0 {
            failed = code;
        }
    }
    if longest.is_zero() {
        longest = default_run;
    }
    RunPlan::Exit {
        after: longest,
        code: failed,
    }
}

/// The plan of `pod`: its annotations, else the first matching rule, else the default.
pub fn plan(rules: &[RunRule], default_run: Duration, pod: &Pod) -> RunPlan {
    if let Some(p) = annotated_plan(pod) {
        return p;
    }
    if let Some(rule) = rules.iter().find(|r| r.selector.matches(pod)) {
        tracing::debug!(pod = %pod.name_any(), rule = %rule.name, "run rule");
        return rule.plan;
    }
    default_plan(pod, default_run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ONE_S: Duration = Duration::from_secs(1);

    fn pod(v: serde_json::Value) -> Pod {
        let mut base = json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn exit(secs: u64, code: i32) -> RunPlan {
        RunPlan::Exit {
            after: Duration::from_secs(secs),
            code,
        }
    }

    #[test]
    fn run_durations() {
        assert_eq!(parse_run_duration("30"), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_run_duration("500ms"),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_run_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_run_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_run_duration("soon"), None);
        assert_eq!(parse_run_duration("-1s"), None);
        assert_eq!(parse_run_duration("1e300h"), None, "too long is refused");
    }

    /// `kubectl run x --image=busybox --restart=Never -- true` (args only) succeeds;
    /// `-- false` fails with 1, as the program would.
    #[test]
    fn kubectl_run_restart_never_pods_end_as_their_command() {
        let t = pod(json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "args": ["true"]}]}}));
        assert_eq!(plan(&[], ONE_S, &t), exit(1, 0));
        let f = pod(json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["/bin/false"]}]}}));
        assert_eq!(plan(&[], ONE_S, &f), exit(1, 1));
        let sleepy = pod(json!({"spec": {"restartPolicy": "OnFailure",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "20"]}]}}));
        assert_eq!(plan(&[], ONE_S, &sleepy), exit(20, 0));
        let script = pod(json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox",
                "command": ["sh", "-c", "echo hi; sleep 3 && false || exit 4"]}]}}));
        assert_eq!(plan(&[], ONE_S, &script), exit(3, 4));
        let forever = pod(json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "infinity"]}]}}));
        assert_eq!(plan(&[], ONE_S, &forever), RunPlan::Forever);
    }

    /// kwok's `pod-complete` stage: a pod owned by a Job completes, even without a command;
    /// `helm test` pods (hook `test`) complete too.
    #[test]
    fn job_and_helm_test_pods_complete_by_default() {
        let job = pod(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "batch/v1",
            "kind": "Job", "name": "j", "uid": "u", "controller": true}]},
            "spec": {"restartPolicy": "Never"}}),
        );
        assert_eq!(plan(&[], ONE_S, &job), exit(1, 0));
        let helm = pod(
            json!({"metadata": {"annotations": {"helm.sh/hook": "test"}},
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox", "command": ["wget"], "args": ["web:80"]}]}}),
        );
        assert_eq!(plan(&[], ONE_S, &helm), exit(1, 0));
    }

    /// Servers keep running: `restartPolicy: Always` (the default) whatever the command, and
    /// a bare `Never` pod without a command (its image's entrypoint is unknown).
    #[test]
    fn servers_keep_running() {
        let deploy = pod(
            json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "nginx", "command": ["nginx"]}]}}),
        );
        assert_eq!(plan(&[], ONE_S, &deploy), RunPlan::Forever);
        let bare = pod(json!({"spec": {"restartPolicy": "Never"}}));
        assert_eq!(plan(&[], ONE_S, &bare), RunPlan::Forever);
    }

    /// The annotations win over the rules, which win over the defaults; the first matching
    /// rule applies; a selector's fields all have to match.
    #[test]
    fn annotations_then_rules_then_defaults() {
        let rules = vec![
            RunRule {
                name: "crashing-nginx".into(),
                selector: RunSelector {
                    images: vec!["*nginx:1.*".into()],
                    labels: [("tier".to_owned(), "*".to_owned())].into(),
                    ..Default::default()
                },
                plan: exit(5, 2),
            },
            RunRule {
                name: "all-nginx".into(),
                selector: RunSelector {
                    images: vec!["*nginx*".into()],
                    ..Default::default()
                },
                plan: exit(7, 0),
            },
        ];
        let labelled = pod(json!({"metadata": {"labels": {"tier": "web"}},
            "spec": {"containers": [{"name": "c", "image": "docker.io/nginx:1.27"}]}}));
        assert_eq!(plan(&rules, ONE_S, &labelled), exit(5, 2));
        let unlabelled =
            pod(json!({"spec": {"containers": [{"name": "c", "image": "docker.io/nginx:1.27"}]}}));
        assert_eq!(plan(&rules, ONE_S, &unlabelled), exit(7, 0));
        let annotated = pod(json!({"metadata": {"labels": {"tier": "web"},
            "annotations": {RUN_DURATION_ANNOTATION: "forever"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}));
        assert_eq!(plan(&rules, ONE_S, &annotated), RunPlan::Forever);
        let other = pod(json!({"spec": {"containers": [{"name": "c", "image": "redis"}]}}));
        assert_eq!(plan(&rules, ONE_S, &other), RunPlan::Forever);
    }

    #[test]
    fn globs() {
        assert!(glob("*", ""));
        assert!(glob("nginx", "nginx"));
        assert!(!glob("nginx", "nginx:1"));
        assert!(glob("*/pause:*", "registry.k8s.io/pause:3.10"));
        assert!(glob("a*b*c", "aXbYc"));
        assert!(!glob("a*b*c", "acb"));
        assert!(!glob("ab*ba", "aba"));
    }
}
