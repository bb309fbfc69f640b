//! Real etcd servers for the tests: each on free loopback ports with its own data directory.
//!
//! The binary is `$CCM_ETCD` when set, else `etcd` on PATH; tests fail (never skip) when it
//! is missing. `scripts/etcd.sh` builds the etcd the served Kubernetes release tests with (3.6.6,
//! through `scripts/upstream.sh`) and prints its path; `scripts/test` exports it as `CCM_ETCD`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::free_port;

/// The etcd binary the tests run.
pub fn binary() -> PathBuf {
    std::env::var_os("CCM_ETCD").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

/// One etcd member: its process, ports and data directory. Dropping it kills the process.
pub struct EtcdMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    initial_cluster: String,
    dir: TempDir,
    child: Option<Child>,
}

/// One etcd cluster of one or more members on loopback.
pub struct Etcd {
    /// The members, in start order.
    pub members: Vec<EtcdMember>,
}

impl EtcdMember {
    /// The member's client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Whether its process is running (not stopped by [`EtcdMember::stop`]).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    fn spawn(&mut self, state: &str) {
        let binary = binary();
        let mut command = Command::new(&binary);
        command
            .arg(format!("--name={}", self.name))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={}", self.url()))
            .arg(format!("--advertise-client-urls={}", self.url()))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{}",
                self.peer_port
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                self.peer_port
            ))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg(format!("--initial-cluster-state={state}"))
            .arg("--initial-cluster-token=ccm-rs-test")
            .arg("--log-level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().unwrap_or_else(|error| {
            panic!(
                "running etcd ({}) failed: {error}; the etcd tests need etcd 3.5 or 3.6 \
                 (scripts/etcd.sh builds it; CCM_ETCD names the binary)",
                binary.display()
            )
        });
        self.child = Some(child);
    }

    /// Kills the member's process (its data directory stays, for [`EtcdMember::restart`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the stopped member again on the same ports and data, and waits until it
    /// accepts connections.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "the member is running");
        self.spawn("existing");
        wait_listening(self.client_port).await;
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn wait_listening(port: u16) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("etcd did not listen on 127.0.0.1:{port} within 10 s");
}

impl Etcd {
    /// A single-member etcd on free loopback ports with a fresh data directory.
    pub async fn start() -> Self {
        Self::cluster(1).await
    }

    /// An etcd cluster of `members` members on loopback.
    pub async fn cluster(members: usize) -> Self {
        let ports: Vec<(u16, u16)> = (0..members).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut started: Vec<EtcdMember> = ports
            .iter()
            .enumerate()
            .map(|(i, &(client_port, peer_port))| EtcdMember {
                name: format!("m{i}"),
                client_port,
                peer_port,
                initial_cluster: initial_cluster.clone(),
                dir: tempfile::tempdir().expect("a temp dir for etcd"),
                child: None,
            })
            .collect();
        for member in &mut started {
            member.spawn("new");
        }
        for member in &started {
            wait_listening(member.client_port).await;
        }
        Self { members: started }
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::url).collect()
    }

    /// The members' client URLs joined by commas, as `--etcd-servers` takes them.
    pub fn servers_flag(&self) -> String {
        self.endpoints().join(",")
    }
}
