//! Durability: every write a `SqliteStore` acknowledged survives a SIGKILL of the
//! process, and revisions keep increasing after recovery.
//!
//! The parent test re-runs this test binary as a child process (running only the
//! ignored `durability_child_writer` test, selected by an environment variable). The
//! child writes with many concurrent tasks and prints one `ACK <key> <revision>
//! <value>` line per acknowledged write. The parent reads a good number of lines,
//! SIGKILLs the child in the middle of the burst, drains what the child printed before
//! dying, reopens the store on the same directory and checks every acknowledged write.
//! It does that twice on the same directory, so recovery after a crash is itself
//! crash-tested.
//!
//! This exercises process crashes. Power loss (the OS losing its page cache) cannot be
//! simulated here; `synchronous=FULL` is what covers it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use core_cluster::store::{SqliteOptions, SqliteStore, Store};

const CHILD_DIR_ENV: &str = "CORE_CLUSTER_DURABILITY_CHILD_DIR";
const CHILD_ROUND_ENV: &str = "CORE_CLUSTER_DURABILITY_CHILD_ROUND";
const WRITERS: usize = 16;
const ACKS_BEFORE_KILL: usize = 1_500;

/// The child: writes forever (until killed) and reports every acknowledged write.
#[test]
#[ignore = "helper: run as a child process by acknowledged_writes_survive_sigkill"]
fn durability_child_writer() {
    let dir =
        std::env::var(CHILD_DIR_ENV).expect("run only by acknowledged_writes_survive_sigkill");
    let round = std::env::var(CHILD_ROUND_ENV).expect("round");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = Arc::new(
            SqliteStore::open(&dir, SqliteOptions::default())
                .await
                .unwrap(),
        );
        // The harness printed "test durability_child_writer ... " without a newline.
        println!();
        println!("OPENED {}", store.current_revision().await.unwrap());
        let tasks: Vec<_> = (0..WRITERS)
            .map(|t| {
                let store = store.clone();
                let round = round.clone();
                tokio::spawn(async move {
                    let counter = format!("/registry/durability/r{round}/counter-{t}");
                    // Safety net: a child that is never killed stops by itself.
                    for i in 0..200_000u64 {
                        let (key, revision) = if i % 3 == 2 {
                            let value = Bytes::from(i.to_string());
                            let revision = if i == 2 {
                                store.create(&counter, value).await.unwrap()
                            } else {
                                store.update(&counter, value, None).await.unwrap()
                            };
                            (counter.clone(), revision)
                        } else {
                            let key = format!("/registry/durability/r{round}/t{t}/{i}");
                            let revision = store
                                .create(&key, Bytes::from(i.to_string()))
                                .await
                                .unwrap();
                            (key, revision)
                        };
                        // `println!` writes the whole line at once (stdout is line
                        // buffered), so the parent never sees a torn line.
                        println!("ACK {key} {revision} {i}");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

struct Ack {
    revision: u64,
    value: u64,
}

/// What one child reported.
#[derive(Default)]
struct Collected {
    opened: Option<u64>,
    acks: BTreeMap<String, Ack>,
    count: usize,
}

impl Collected {
    fn record(&mut self, line: &str) -> anyhow::Result<()> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["OPENED", revision] => self.opened = Some(revision.parse()?),
            ["ACK", key, revision, value] => {
                let ack = Ack {
                    revision: revision.parse()?,
                    value: value.parse()?,
                };
                if let Some(previous) = self.acks.get(*key) {
                    ensure!(
                        ack.revision > previous.revision,
                        "acks for one key must have increasing revisions"
                    );
                }
                self.acks.insert(key.to_string(), ack);
                self.count += 1;
            }
            _ => {} // the test harness's own lines
        }
        Ok(())
    }
}

/// Runs one child until `ACKS_BEFORE_KILL` acknowledgements, kills it, and returns the
/// revision it opened at and every acknowledgement it printed, by key (the last one
/// per key).
fn crash_one_child(
    dir: &std::path::Path,
    round: u32,
) -> anyhow::Result<(u64, BTreeMap<String, Ack>)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "durability::durability_child_writer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_ROUND_ENV, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning the child")?;
    let stdout = child.stdout.take().context("child stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut seen = Collected::default();
    while seen.count < ACKS_BEFORE_KILL {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => seen.record(&line)?,
            Err(e) => {
                let _ = child.kill();
                bail!("child stopped reporting after {} acks: {e}", seen.count);
            }
        }
    }
    // SIGKILL on Unix: no destructor, no flush, no clean close of the database.
    child.kill().context("killing the child")?;
    let status = child.wait()?;
    ensure!(
        !status.success(),
        "the child must have been killed, got {status}"
    );
    // Lines the child printed before it died are acknowledgements too.
    reader.join().expect("reader thread");
    while let Ok(line) = rx.try_recv() {
        seen.record(&line)?;
    }
    let opened = seen
        .opened
        .context("the child never reported opening the store")?;
    eprintln!(
        "round {round}: child opened at revision {opened}, {} acks in all",
        seen.count
    );
    Ok((opened, seen.acks))
}

#[test]
fn acknowledged_writes_survive_sigkill() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut highest_acked = 0;
    let mut all_acks = BTreeMap::new();
    for round in 0..2 {
        let (opened, acks) = crash_one_child(dir.path(), round)?;
        ensure!(
            opened >= highest_acked,
            "round {round} reopened at revision {opened}, below the acknowledged {highest_acked}"
        );
        highest_acked = highest_acked.max(acks.values().map(|a| a.revision).max().unwrap_or(0));
        all_acks.extend(acks);

        runtime.block_on(async {
            let store = SqliteStore::open(dir.path(), SqliteOptions::default()).await?;
            let recovered = store.current_revision().await?;
            ensure!(
                recovered >= highest_acked,
                "recovered revision {recovered} is below acknowledged revision {highest_acked}"
            );
            for (key, ack) in &all_acks {
                let kv = store
                    .get(key)
                    .await?
                    .with_context(|| format!("acknowledged key {key} is missing"))?;
                ensure!(
                    kv.mod_revision >= ack.revision,
                    "{key}: mod_revision {} is older than the acknowledged {}",
                    kv.mod_revision,
                    ack.revision
                );
                let value: u64 = std::str::from_utf8(&kv.value)?.parse()?;
                ensure!(
                    value >= ack.value,
                    "{key}: value {value} < acknowledged {}",
                    ack.value
                );
                if !key.contains("/counter-") {
                    ensure!(
                        kv.create_revision == ack.revision && kv.mod_revision == ack.revision,
                        "{key}: created at {} but acknowledged at {}",
                        kv.create_revision,
                        ack.revision
                    );
                }
            }
            let fresh = store
                .create("/registry/durability/after-crash", Bytes::new())
                .await?;
            ensure!(
                fresh > highest_acked,
                "new write got revision {fresh}, not above the acknowledged {highest_acked}"
            );
            store
                .delete("/registry/durability/after-crash", None)
                .await?;
            highest_acked = store.current_revision().await?;
            store.close().await?;
            anyhow::Ok(())
        })?;
        eprintln!(
            "round {round}: all {} acknowledged keys present after the crash",
            all_acks.len()
        );
    }
    Ok(())
}
