//! `/exec/{namespace}/{pod}/{container}`: what a simulated container runs, never a host
//! command. A small built-in set (`hostname`, `env`, `cat` of the pod's files, `echo`,
//! `ls`, `true`, `false`, `exit`, `sleep`, `sh -c` over those, an interactive `sh`) with the
//! pod's environment, streamed over WebSocket with Kubernetes' channel protocols; the exit
//! code is reported on the error channel as kubelet's `remotecommand` server does
//! (`pkg/kubelet/cri/streaming/remotecommand/websocket.go`, `NonZeroExitCode` Status).

use std::{collections::BTreeMap, time::Duration};

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::json;
use tokio::sync::mpsc;

use super::websocket::{Incoming, Reader, Writer};

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// `v5.channel.k8s.io`: "close this channel".
const CLOSE: u8 = 255;

/// What a session asked for (`input`, `output`, `error`, `tty`) and its protocol.
#[derive(Debug, Clone)]
pub(crate) struct Streams {
    pub(crate) stdin: bool,
    pub(crate) stdout: bool,
    pub(crate) stderr: bool,
    pub(crate) tty: bool,
    pub(crate) protocol: &'static str,
}

/// The simulated container's view: its hostname, environment and files.
#[derive(Debug, Clone)]
pub(crate) struct Container {
    pub(crate) hostname: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) files: BTreeMap<String, String>,
}

impl Container {
    /// The container `name` of `pod`.
    pub(crate) fn of(pod: &Pod, name: &str) -> Self {
        let spec = pod.spec.as_ref();
        let hostname = spec
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| pod.name_any());
        let namespace = pod.namespace().unwrap_or_default();
        let mut env = BTreeMap::from([
            (
                "PATH".to_owned(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            ),
            ("HOSTNAME".to_owned(), hostname.clone()),
            ("HOME".to_owned(), "/root".to_owned()),
        ]);
        if let Some(c) = spec.and_then(|s| s.containers.iter().find(|c| c.name == name)) {
            for e in c.env.iter().flatten() {
                if let Some(v) = &e.value {
                    env.insert(e.name.clone(), v.clone());
                }
            }
        }
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        let files = BTreeMap::from([
            ("/etc/hostname".to_owned(), format!("{hostname}\n")),
            (
                "/etc/hosts".to_owned(),
                format!(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n{ip}\t{hostname}\n"
                ),
            ),
            (
                "/etc/resolv.conf".to_owned(),
                format!(
                    "search {namespace}.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
                ),
            ),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/namespace".to_owned(),
                namespace,
            ),
        ]);
        Container {
            hostname,
            env,
            files,
        }
    }
}

/// What a session runs.
pub(crate) enum Program {
    /// A command of the built-in set (`/exec`).
    Command(Vec<String>),
    /// The container's main process (`/attach`): what is typed on its stdin comes back on
    /// its stdout (the process is a `cat`); without stdin, its output from now on (the
    /// container's log lines as they are written) until the client detaches.
    Main(Option<futures::stream::BoxStream<'static, Bytes>>),
}

/// Output of a running command, to the writer task.
enum Out {
    Data(u8, Bytes),
    Pong(Bytes),
}

struct Proc<'a> {
    container: &'a Container,
    streams: &'a Streams,
    tty: bool,
    out: mpsc::Sender<Out>,
    stdin: Option<mpsc::Receiver<Bytes>>,
}

impl Proc<'_> {
    async fn write(&self, channel: u8, text: &str) {
        let (channel, text) = if self.tty {
            (STDOUT, text.replace('\n', "\r\n"))
        } else {
            (channel, text.to_owned())
        };
        // A stream the client did not ask for is discarded.
        let wanted = match channel {
            STDOUT => self.streams.stdout,
            _ => self.streams.stderr,
        };
        if !wanted {
            return;
        }
        let _ = self.out.send(Out::Data(channel, Bytes::from(text))).await;
    }

    async fn read_stdin(&mut self) -> Option<Bytes> {
        self.stdin.as_mut()?.recv().await
    }

    /// Runs one command; its exit code.
    async fn run(&mut self, argv: &[String]) -> i32 {
        let Some(cmd) = argv.first() else { return 0 };
        let args = &argv[1..];
        let name = cmd.rsplit('/').next().unwrap_or(cmd);
        match name {
            "hostname" => {
                self.write(STDOUT, &format!("{}\n", self.container.hostname))
                    .await;
                0
            }
            "env" | "printenv" => {
                let text: String = self
                    .container
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect();
                self.write(STDOUT, &text).await;
                0
            }
            "echo" => {
                self.write(STDOUT, &format!("{}\n", args.join(" "))).await;
                0
            }
            "true" => 0,
            "false" => 1,
            "exit" => args.first().and_then(|a| a.parse().ok()).unwrap_or(0),
            "sleep" => {
                let secs: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(0.0);
                tokio::time::sleep(Duration::from_secs_f64(secs.clamp(0.0, 3600.0))).await;
                0
            }
            "ls" => {
                self.write(
                    STDOUT,
                    "bin\ndev\netc\nhome\nproc\nroot\nsys\ntmp\nusr\nvar\n",
                )
                .await;
                0
            }
            "cat" if args.is_empty() => {
                while let Some(data) = self.read_stdin().await {
                    let _ = self.out.send(Out::Data(STDOUT, data)).await;
                }
                0
            }
            "cat" => {
                let mut code = 0;
                for f in args {
                    match self.container.files.get(f.as_str()) {
                        Some(text) => {
                            let text = text.clone();
                            self.write(STDOUT, &text).await;
                        }
                        None => {
                            self.write(STDERR, &format!("cat: {f}: No such file or directory\n"))
                                .await;
                            code = 1;
                        }
                    }
                }
                code
            }
            "sh" | "bash" | "ash" => match args {
                [c, script, ..] if c == "-c" => Box::pin(self.script(script)).await.0,
                _ => Box::pin(self.interactive()).await,
            },
            other => {
                self.write(STDERR, &format!("sh: {other}: not found\n"))
                    .await;
                127
            }
        }
    }

    /// The main process of an attach session; ends when its stdin closes.
    async fn main_process(
        &mut self,
        output: Option<futures::stream::BoxStream<'static, Bytes>>,
    ) -> i32 {
        use futures::StreamExt as _;
        if self.stdin.is_some() {
            while let Some(data) = self.read_stdin().await {
                let text = String::from_utf8_lossy(&data).replace('\r', "\n");
                self.write(STDOUT, &text).await;
            }
            return 0;
        }
        if let Some(mut output) = output {
            while let Some(chunk) = output.next().await {
                self.write(STDOUT, &String::from_utf8_lossy(&chunk)).await;
            }
            return 0;
        }
        // Nothing to say until the client detaches.
        std::future::pending::<()>().await;
        0
    }

    /// `sh -c`: commands separated by `;` and `&&`; `exit` ends the script. The exit code,
    /// and whether `exit` ran.
    async fn script(&mut self, script: &str) -> (i32, bool) {
        let mut code = 0;
        for (sequence_op, line) in split_script(script) {
            if sequence_op && code != 0 {
                continue;
            }
            let argv = words(&line, &self.container.env);
            if argv.first().map(String::as_str) == Some("exit") {
                return (
                    argv.get(1).and_then(|a| a.parse().ok()).unwrap_or(code),
                    true,
                );
            }
            code = Box::pin(self.run(&argv)).await;
        }
        (code, false)
    }

    /// `sh` reading commands from stdin, a prompt when on a terminal.
    async fn interactive(&mut self) -> i32 {
        let mut pending = String::new();
        let mut code = 0;
        if self.tty {
            self.write(STDOUT, "# ").await;
        }
        while let Some(data) = self.read_stdin().await {
            let text = String::from_utf8_lossy(&data);
            if self.tty {
                // The terminal echoes what is typed.
                self.write(STDOUT, &text.replace('\r', "\n")).await;
            }
            pending.push_str(&text.replace('\r', "\n"));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                let (c, exited) = self.script(line.trim()).await;
                code = c;
                if exited {
                    return code;
                }
                if self.tty {
                    self.write(STDOUT, "# ").await;
                }
            }
        }
        code
    }
}

/// `(runs only if the previous succeeded, command)` pieces of a script.
fn split_script(script: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for part in script.split([';', '\n']) {
        for (i, piece) in part.split("&&").enumerate() {
            if !piece.trim().is_empty() {
                out.push((i > 0, piece.trim().to_owned()));
            }
        }
    }
    out
}

/// Shell words: whitespace-separated, single and double quotes, `$VAR` from `env`.
fn words(line: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (q, '$') if q != Some('\'') => {
                let mut name = String::new();
                while let Some(&n) = chars.peek() {
                    if n.is_ascii_alphanumeric() || n == '_' {
                        name.push(n);
                        chars.next();
                    } else {
                        break;
                    }
                }
                if name.is_empty() {
                    word.push('$');
                } else {
                    word.push_str(env.get(&name).map(String::as_str).unwrap_or(""));
                }
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (_, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The Status a `v4`/`v5` client reads on the error channel (`remotecommand`'s
/// `NonZeroExitCode`); for older protocols the error text alone.
fn exit_status(protocol: &str, argv: &[String], code: i32) -> Option<Vec<u8>> {
    let v4 = matches!(protocol, "v4.channel.k8s.io" | "v5.channel.k8s.io");
    if code == 0 {
        return v4.then(|| br#"{"metadata":{},"status":"Success"}"#.to_vec());
    }
    let message = format!(
        "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
        argv.join(" ")
    );
    if !v4 {
        return Some(message.into_bytes());
    }
    let status = json!({
        "metadata": {}, "status": "Failure", "message": message,
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    });
    Some(status.to_string().into_bytes())
}

/// Runs `argv` in `container` over an upgraded connection until the command exits (its
/// status written, the connection closed) or the client goes away.
pub(crate) async fn session<IO>(io: IO, streams: Streams, container: Container, program: Program)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(16);
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let v5 = streams.protocol == "v5.channel.k8s.io";
    // The client's messages: stdin, resize (ignored), pings, v5's close of stdin.
    let reader = tokio::spawn({
        // Weak: the writer closes the connection once the command is done, whatever the
        // client still sends.
        let out = out_tx.downgrade();
        async move {
            let mut reader = Reader::new(read);
            let mut stdin = Some(stdin_tx);
            loop {
                match reader.next().await {
                    Ok(Incoming::Closed) => return,
                    Err(ping) => {
                        if let Some(out) = out.upgrade() {
                            let _ = out.send(Out::Pong(ping)).await;
                        }
                    }
                    Ok(Incoming::Data(m)) if m.is_empty() => {}
                    Ok(Incoming::Data(m)) => match (m[0], m.get(1)) {
                        (CLOSE, Some(&STDIN)) if v5 => stdin = None,
                        (STDIN, _) => {
                            if let Some(tx) = &stdin
                                && m.len() > 1
                            {
                                let _ = tx.send(m.slice(1..)).await;
                            }
                        }
                        (RESIZE, _) => {}
                        _ => {}
                    },
                }
            }
        }
    });
    let writer = tokio::spawn(async move {
        let mut w = Writer::new(write);
        while let Some(out) = out_rx.recv().await {
            let result = match out {
                Out::Data(channel, data) => w.channel(channel, &data).await,
                Out::Pong(payload) => w.pong(&payload).await,
            };
            if result.is_err() {
                return;
            }
        }
        let _ = w.close().await;
    });
    let mut proc = Proc {
        container: &container,
        streams: &streams,
        tty: streams.tty,
        out: out_tx,
        stdin: streams.stdin.then_some(stdin_rx),
    };
    let gone = proc.out.clone();
    let (argv, main) = match program {
        Program::Command(argv) => (argv, None),
        Program::Main(output) => (Vec::new(), Some(output)),
    };
    let run = async {
        match main {
            Some(output) => proc.main_process(output).await,
            None => proc.run(&argv).await,
        }
    };
    let code = tokio::select! {
        code = run => code,
        // The client went away (the writer stopped): the command is abandoned.
        () = gone.closed() => {
            reader.abort();
            return;
        }
    };
    drop(gone);
    if let Some(status) = exit_status(streams.protocol, &argv, code) {
        let _ = proc.out.send(Out::Data(ERROR, Bytes::from(status))).await;
    }
    drop(proc);
    let _ = writer.await;
    reader.abort();
}

/// Runs `argv` to its end with no stdin and no terminal, as kubelet's `RunInContainer`
/// (`/run`) does: (stdout and stderr together, the exit code).
pub(crate) async fn run_to_end(container: &Container, argv: &[String]) -> (Vec<u8>, i32) {
    let streams = Streams {
        stdin: false,
        stdout: true,
        stderr: true,
        tty: false,
        protocol: "",
    };
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(16);
    let collect = async move {
        let mut output = Vec::new();
        while let Some(out) = out_rx.recv().await {
            if let Out::Data(_, data) = out {
                output.extend_from_slice(&data);
            }
        }
        output
    };
    let run = async {
        let mut proc = Proc {
            container,
            streams: &streams,
            tty: false,
            out: out_tx,
            stdin: None,
        };
        proc.run(argv).await
    };
    let (code, output) = tokio::join!(run, collect);
    (output, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_split_quote_and_expand() {
        let env = BTreeMap::from([("HOSTNAME".to_owned(), "web".to_owned())]);
        assert_eq!(
            words(r#"echo "a b" 'c $HOSTNAME' $HOSTNAME"#, &env),
            ["echo", "a b", "c $HOSTNAME", "web"]
        );
        assert_eq!(
            split_script("echo a; false && echo b; exit 3"),
            [
                (false, "echo a".to_owned()),
                (false, "false".to_owned()),
                (true, "echo b".to_owned()),
                (false, "exit 3".to_owned())
            ]
        );
    }

    /// `remotecommand`'s v4 error channel: Success, or `NonZeroExitCode` with the code.
    #[test]
    fn exit_codes_are_reported_as_upstreams_status() {
        let argv = ["sh".to_owned(), "-c".to_owned(), "exit 3".to_owned()];
        let s: serde_json::Value =
            serde_json::from_slice(&exit_status("v5.channel.k8s.io", &argv, 3).unwrap()).unwrap();
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
        assert_eq!(
            exit_status("v4.channel.k8s.io", &argv, 0).unwrap(),
            br#"{"metadata":{},"status":"Success"}"#
        );
        assert_eq!(exit_status("channel.k8s.io", &argv, 0), None);
    }
}
