//! kubectl v1.32 against `ccm apiserver`, unchanged: the commands an operator uses.

use std::time::Duration;

use crate::support::{ApiServerProcess, require_kubectl, wait_until};

const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels:
    node-role.kubernetes.io/worker: ""
    topology.kubernetes.io/zone: zone-a
status:
  conditions:
  - type: Ready
    status: "True"
    reason: KubeletReady
    message: kubelet is posting ready status
  - type: MemoryPressure
    status: "False"
    reason: KubeletHasSufficientMemory
    message: kubelet has sufficient memory available
  nodeInfo:
    kubeletVersion: v1.33.0
    osImage: Simulated Linux
    kernelVersion: 6.1.0
    containerRuntimeVersion: sim://1.0
    architecture: amd64
    operatingSystem: linux
    bootID: b
    kubeProxyVersion: ""
    machineID: m
    systemUUID: s
  addresses:
  - type: InternalIP
    address: 10.0.0.10
"#;

const OTHERS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: default
spec:
  nodeName: node-a
  containers:
  - name: nginx
    image: nginx:1.25
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: LoadBalancer
  selector:
    app: web
  ports:
  - port: 80
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: node-a
  namespace: kube-node-lease
spec:
  holderIdentity: node-a
  leaseDurationSeconds: 40
---
apiVersion: v1
kind: Event
metadata:
  name: node-a.start
  namespace: default
involvedObject:
  kind: Node
  name: node-a
  uid: node-a    # kubelet's node events use the node name as uid; describe asks for both
  apiVersion: v1
reason: Starting
message: Starting kubelet.
type: Normal
source:
  component: kubelet
"#;

fn started() -> (tempfile::TempDir, ApiServerProcess) {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    let out = server.kubectl_stdin(&["apply", "-f", "-"], NODE);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, server)
}

fn header(output: &str) -> Vec<&str> {
    output
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

#[test]
fn get_prints_the_usual_columns_in_every_format() {
    let (_dir, server) = started();
    let out = server.kubectl_stdin(&["apply", "-f", "-"], OTHERS);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let nodes = server.kubectl_ok(&["get", "nodes"]);
    assert_eq!(
        header(&nodes),
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    );
    let row: Vec<&str> = nodes.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        (row[0], row[1], row[2], row[4]),
        ("node-a", "Ready", "worker", "v1.33.0")
    );
    let wide = server.kubectl_ok(&["get", "nodes", "-o", "wide"]);
    assert!(
        header(&wide).starts_with(&[
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE"
        ]),
        "{wide}"
    );
    assert!(wide.contains("10.0.0.10"));

    let pods = server.kubectl_ok(&["get", "pods", "-o", "wide"]);
    assert_eq!(
        header(&pods)[..5],
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert!(
        pods.contains("web")
            && pods.contains("0/1")
            && pods.contains("Pending")
            && pods.contains("node-a"),
        "{pods}"
    );

    let svcs = server.kubectl_ok(&["get", "services"]);
    assert_eq!(
        header(&svcs),
        [
            "NAME",
            "TYPE",
            "CLUSTER-IP",
            "EXTERNAL-IP",
            "PORT(S)",
            "AGE"
        ]
    );
    let web = svcs.lines().find(|l| l.starts_with("web ")).unwrap();
    assert!(
        web.contains("LoadBalancer") && web.contains("<pending>") && web.contains("80:3"),
        "{web}"
    );
    assert!(
        svcs.contains("kubernetes"),
        "the kubernetes Service exists: {svcs}"
    );

    let leases = server.kubectl_ok(&["get", "leases", "-n", "kube-node-lease"]);
    assert_eq!(header(&leases), ["NAME", "HOLDER", "AGE"]);
    let events = server.kubectl_ok(&["get", "events"]);
    assert_eq!(
        header(&events),
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    );
    assert!(
        events.contains("node/node-a") && events.contains("Starting kubelet."),
        "{events}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&server.kubectl_ok(&["get", "node", "node-a", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "Node");
    assert!(
        json["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    let list: serde_json::Value =
        serde_json::from_str(&server.kubectl_ok(&["get", "pods", "-A", "-o", "json"])).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let yaml = server.kubectl_ok(&["get", "service", "web", "-o", "yaml"]);
    assert!(
        yaml.contains("nodePort: 3") && yaml.contains("clusterIP: 10."),
        "{yaml}"
    );
}

#[test]
fn describe_node_shows_conditions_lease_and_events() {
    let (_dir, server) = started();
    let out = server.kubectl_stdin(&["apply", "-f", "-"], OTHERS);
    assert!(out.status.success());
    let text = server.kubectl_ok(&["describe", "node", "node-a"]);
    for want in [
        "Name:               node-a",
        "Roles:              worker",
        "KubeletReady",
        "HolderIdentity:  node-a",
        "InternalIP:  10.0.0.10",
        "Starting kubelet.",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}

#[test]
fn cordon_label_annotate_taint_and_delete() {
    let (_dir, server) = started();
    server.kubectl_ok(&["cordon", "node-a"]);
    assert!(
        server
            .kubectl_ok(&["get", "node", "node-a"])
            .contains("Ready,SchedulingDisabled")
    );
    server.kubectl_ok(&["uncordon", "node-a"]);
    assert!(
        !server
            .kubectl_ok(&["get", "node", "node-a"])
            .contains("SchedulingDisabled")
    );

    server.kubectl_ok(&["label", "node", "node-a", "rack=r7"]);
    server.kubectl_ok(&["annotate", "node", "node-a", "example.com/note=hello"]);
    server.kubectl_ok(&["taint", "node", "node-a", "dedicated=db:NoSchedule"]);
    let got = server.kubectl_ok(&["get", "node", "node-a", "-o", "jsonpath={.metadata.labels.rack} {.metadata.annotations.example\\.com/note} {.spec.taints[0].key}={.spec.taints[0].value}:{.spec.taints[0].effect}"]);
    assert_eq!(got, "r7 hello dedicated=db:NoSchedule");
    server.kubectl_ok(&["taint", "node", "node-a", "dedicated=db:NoSchedule-"]);
    server.kubectl_ok(&["label", "node", "node-a", "rack-"]);
    let got = server.kubectl_ok(&[
        "get",
        "node",
        "node-a",
        "-o",
        "jsonpath={.spec.taints}|{.metadata.labels.rack}",
    ]);
    assert_eq!(got, "|");
    // A bad taint effect is refused by the server with a field error.
    let out = server.kubectl(&["taint", "node", "node-a", "k=v:Sometimes"]);
    assert!(!out.status.success());

    let out = server.kubectl_ok(&["delete", "node", "node-a"]);
    assert!(out.contains("node \"node-a\" deleted"), "{out}");
    let out = server.kubectl(&["get", "node", "node-a"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nodes \"node-a\" not found"));
}

#[test]
fn apply_client_side_and_server_side() {
    let (_dir, server) = started();
    // Re-applying with a change is a three-way strategic merge patch.
    let changed = NODE.replace("zone-a", "zone-b");
    let out = server.kubectl_stdin(&["apply", "-f", "-"], &changed);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("node/node-a configured"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        server.kubectl_ok(&[
            "get",
            "node",
            "node-a",
            "-o",
            "jsonpath={.metadata.labels.topology\\.kubernetes\\.io/zone}"
        ]),
        "zone-b"
    );

    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: default\ndata:\n  mode: fast\n";
    let out = server.kubectl_stdin(&["apply", "--server-side", "-f", "-"], cm);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("serverside-applied"));
    let managers = server.kubectl_ok(&[
        "get",
        "cm",
        "settings",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(
        managers.split_whitespace().any(|m| m == "kubectl"),
        "{managers}"
    );
    // Strict server-side validation catches unknown fields.
    let bad = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\n  namespace: default\ndatta:\n  x: y\n";
    let out = server.kubectl_stdin(&["apply", "-f", "-"], bad);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown field \"datta\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn get_watch_sees_a_change() {
    let (_dir, server) = started();
    let mut watch = std::process::Command::new("kubectl")
        .env("KUBECONFIG", server.kubeconfig())
        .arg("--cache-dir")
        .arg(server.dir.join("kubectl-cache"))
        .args([
            "get",
            "nodes",
            "-w",
            "-o",
            "custom-columns=NAME:.metadata.name,RACK:.metadata.labels.rack",
            "--no-headers",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(first.starts_with("node-a"), "{first}");
    server.kubectl_ok(&["label", "node", "node-a", "rack=r9"]);
    let mut seen = false;
    let ok = wait_until(Duration::from_secs(10), || {
        while let Ok(line) = rx.try_recv() {
            seen |= line.contains("node-a") && line.contains("r9");
        }
        seen
    });
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(ok, "kubectl get -w did not show the label change");
}

#[test]
fn explain_uses_the_openapi_documents() {
    let (_dir, server) = started();
    let text = server.kubectl_ok(&["explain", "node.spec"]);
    for want in ["KIND:       Node", "providerID", "taints", "podCIDRs"] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}
