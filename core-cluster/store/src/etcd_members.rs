//! The etcd members behind [`EtcdStore`](crate::EtcdStore): one connection per member, the
//! balance set of members that answer, and when a failed request is sent again. The rules
//! are those of etcd's Go client (clientv3), which kube-apiserver uses:
//!
//! - **balancer**: clientv3's round-robin picker hands a request only to a READY
//!   connection. Here each member has its own channel, a request goes to the next member of
//!   the balance set in turn, and a member whose connection fails leaves the set. A probe in
//!   the background (tokio time; 100 ms, doubling up to 2 s) asks it a linearizable read
//!   until it answers, and it rejoins;
//! - **retry interceptor** (`client/v3/retry_interceptor.go`): a request that never reached
//!   etcd (the connection could not be made: tonic's `ConnectError`, gRPC `Unavailable`; in
//!   clientv3 "there is no connection available") is sent to the next member at once,
//!   write or read (`isSafeRetryMutableRPC`). So is one that a member turned away before
//!   handling it: `etcdserver: no leader`, the answer to clientv3's require-leader metadata,
//!   which is set on every request here so that a member cut off from the leader says so
//!   at once instead of holding the request, and a learner's `rpc not supported for
//!   learner`. Such a member leaves the balance set too;
//! - a request that may have reached etcd (the connection broke under it, the deadline
//!   passed, `etcdserver: leader changed`, `etcdserver: request timed out`) is sent again
//!   only if it reads (`isSafeRetryImmutableRPC`: any `Unavailable`). A write reports that
//!   its outcome is unknown ([`SendError::Unknown`]) and its caller decides: the store's
//!   writes are transactions compared on a revision, which etcd applies at most once
//!   however often they are sent, so the store sends them again and tells its own earlier
//!   attempt from another writer's change (see the store's writes).
//!
//! While every member fails, requests are tried round after round (25 ms more pause after
//! each, at most 250 ms) until the request timeout has passed since the first attempt.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, GetOptions, WatchOptions, WatchStream};
use tokio::time::Instant;

/// The first pause of a probe of a member out of the balance set; it doubles after each
/// failed probe up to [`PROBE_MAX`].
const PROBE_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between two probes of a member out of the balance set.
const PROBE_MAX: Duration = Duration::from_secs(2);
/// The pause after a round in which every member failed, times the round's number (clientv3
/// waits 25 ms between attempts), capped at [`ROUND_PAUSE_MAX`].
const ROUND_PAUSE: Duration = Duration::from_millis(25);
/// The longest pause between two rounds.
const ROUND_PAUSE_MAX: Duration = Duration::from_millis(250);

/// What a failed request tells about its fate and about the member it went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// It never reached etcd: the connection to the member could not be made.
    NotSent,
    /// The member turned it away unhandled: it has no leader (the require-leader check)
    /// or is a learner, which serves no such request.
    TurnedAway,
    /// It may have reached etcd and been applied. `broken`: the connection failed under it
    /// (rather than etcd answering that it timed out or that the leader changed).
    Unknown {
        /// The member's connection failed, so the member leaves the balance set.
        broken: bool,
    },
    /// etcd answered it with an error that sending it again would not change.
    Answered,
}

/// Why a request failed after the members were tried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// etcd answered with an error (a compacted revision, a request too large…).
    #[error("{0}")]
    Answered(#[source] etcd_client::Error),
    /// A write that may have been applied or not: the connection failed after it was sent,
    /// or etcd could not say (a timeout, a leader change).
    #[error("the outcome is unknown (the request may have reached etcd): {0}")]
    Unknown(#[source] etcd_client::Error),
    /// No member took the request before the deadline; it was applied nowhere.
    #[error(
        "no etcd member of {endpoints} took the request within {budget:?}; the last error: {last}"
    )]
    Unreachable {
        /// The members' URLs, comma-separated.
        endpoints: String,
        /// How long the members were tried.
        budget: Duration,
        /// The last member's error.
        #[source]
        last: etcd_client::Error,
    },
}

impl SendError {
    /// etcd's own error, when etcd answered.
    pub(crate) fn answered(&self) -> Option<&etcd_client::Error> {
        match self {
            SendError::Answered(error) => Some(error),
            _ => None,
        }
    }
}

/// Whether a request that fails may be sent again after it may have reached etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// A read: sent again on any `Unavailable` (`isSafeRetryImmutableRPC`).
    Repeatable,
    /// A write: sent again only when it never reached etcd (`isSafeRetryMutableRPC`).
    NonRepeatable,
}

/// What a failed request tells, from its error (see [`Fate`]).
pub(crate) fn fate(error: &etcd_client::Error) -> Fate {
    match error {
        // Building a channel: nothing was sent.
        etcd_client::Error::TransportError(_) => Fate::NotSent,
        etcd_client::Error::GRpcStatus(status) => status_fate(status),
        _ => Fate::Answered,
    }
}

fn status_fate(status: &tonic::Status) -> Fate {
    if never_connected(status) {
        return Fate::NotSent;
    }
    let message = status.message();
    // etcd's own errors (`rpctypes`) all begin so; the rest came from the transport.
    if message.starts_with("etcdserver: ") {
        return match (status.code(), message) {
            // Only the require-leader check and the learner check say so, before the
            // request is handled (clientv3 retries the learner's refusal too).
            (_, "etcdserver: no leader" | "etcdserver: rpc not supported for learner") => {
                Fate::TurnedAway
            }
            // "leader changed", "request timed out…", "server stopped": said after the
            // request was proposed, so it may yet be applied.
            (tonic::Code::Unavailable, _) => Fate::Unknown { broken: false },
            _ => Fate::Answered,
        };
    }
    match status.code() {
        tonic::Code::Unavailable
        | tonic::Code::Unknown
        | tonic::Code::Cancelled
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Internal => Fate::Unknown { broken: true },
        _ => Fate::Answered,
    }
}

/// Whether the status comes from failing to connect (tonic's `ConnectError` in its source
/// chain, which tonic turns into `Unavailable` "tcp connect error"): the request was never
/// written to a connection.
fn never_connected(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// One etcd member: its URL, its own client (channel) and whether it is in the balance set.
struct Member {
    url: String,
    client: Client,
    /// In the balance set: its last request did not fail on the connection.
    up: AtomicBool,
    /// A probe is trying it (at most one at a time).
    probing: AtomicBool,
}

/// The members of one etcd cluster, each with its own connection, and the balance set.
pub(crate) struct Members {
    members: Vec<Member>,
    /// Round robin: the member the next request starts at.
    next: AtomicUsize,
    /// How long a request is tried from its first attempt.
    budget: Duration,
    /// The key a probe reads (count only), linearizably: it answers only with a leader.
    probe_key: Vec<u8>,
    endpoints: String,
}

impl Members {
    /// The members, each reached through its own `client`, all in the balance set at first.
    pub(crate) fn new(
        clients: Vec<(String, Client)>,
        budget: Duration,
        probe_key: Vec<u8>,
    ) -> Arc<Self> {
        let endpoints = clients
            .iter()
            .map(|(url, _)| url.as_str())
            .collect::<Vec<_>>()
            .join(",");
        Arc::new(Members {
            members: clients
                .into_iter()
                .map(|(url, client)| Member {
                    url,
                    client,
                    up: AtomicBool::new(true),
                    probing: AtomicBool::new(false),
                })
                .collect(),
            next: AtomicUsize::new(0),
            budget,
            probe_key,
            endpoints,
        })
    }

    /// The order in which to try the members for one request: those in the balance set in
    /// round-robin order, then the others (a last resort while none answers).
    fn order(&self) -> Vec<usize> {
        let count = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % count;
        let mut order: Vec<usize> = (0..count).map(|i| (start + i) % count).collect();
        // Stable: the round-robin order is kept within each group.
        order.sort_by_key(|&i| !self.members[i].up.load(Ordering::Acquire));
        order
    }

    /// The member a long-lived stream (the watch feed) should open on, and its client.
    fn pick(&self) -> (usize, Client) {
        let index = self.order()[0];
        (index, self.members[index].client.clone())
    }

    /// Opens a watch of `key` with `options` on the member a long-lived stream should open
    /// on ([`pick`](Self::pick)), taking responses of up to `max_bytes`; when it cannot be
    /// opened, that member's failure counts as any request's does ([`failed`](Self::failed))
    /// and the error is returned. The stream comes with its member's index, for the failures
    /// of the stream itself.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        key: Vec<u8>,
        options: WatchOptions,
        max_bytes: usize,
    ) -> Result<(usize, WatchStream), etcd_client::Error> {
        let (index, client) = self.pick();
        let opened = client
            .watch_client()
            .max_decoding_message_size(max_bytes)
            .watch(key, Some(options))
            .await;
        match opened {
            Ok(stream) => Ok((index, stream)),
            Err(error) => {
                self.failed(index, &error, fate(&error));
                Err(error)
            }
        }
    }

    /// Whether `index` is in the balance set.
    #[cfg(test)]
    fn is_up(&self, index: usize) -> bool {
        self.members[index].up.load(Ordering::Acquire)
    }

    /// The URLs of the members in the balance set, in the order given.
    pub(crate) fn available(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.up.load(Ordering::Acquire))
            .map(|m| m.url.clone())
            .collect()
    }

    /// Records that a request to member `index` failed with `error`, of `fate`: a member
    /// whose connection failed, or that turned the request away (no leader, a learner),
    /// leaves the balance set until a probe finds it answering again.
    pub(crate) fn failed(self: &Arc<Self>, index: usize, error: &etcd_client::Error, fate: Fate) {
        if matches!(
            fate,
            Fate::NotSent | Fate::TurnedAway | Fate::Unknown { broken: true }
        ) {
            self.leave(index, error);
        }
    }

    fn leave(self: &Arc<Self>, index: usize, error: &etcd_client::Error) {
        let member = &self.members[index];
        if member.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                member = %member.url,
                %error,
                "etcd: a member left the balance set; requests go to the others until it answers again"
            );
        }
        if !member.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(probe(Arc::downgrade(self), index));
        }
    }

    /// Sends the request `op` makes with a member's client to the members in turn, by the
    /// rules of the [module docs](self): to the next member at once when it never reached
    /// etcd (or was turned away), again after a pause when every member failed so, and
    /// for a [`Policy::Repeatable`] request also when it may have reached etcd; until the
    /// budget has passed.
    pub(crate) async fn send<T, F, Fut>(
        self: &Arc<Self>,
        policy: Policy,
        mut op: F,
    ) -> Result<T, SendError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.budget;
        let mut round: u32 = 0;
        loop {
            let mut last = None;
            for index in self.order() {
                let error = match op(self.members[index].client.clone()).await {
                    Ok(value) => return Ok(value),
                    Err(error) => error,
                };
                let fate = fate(&error);
                self.failed(index, &error, fate);
                match fate {
                    Fate::Answered => return Err(SendError::Answered(error)),
                    Fate::Unknown { .. } if policy == Policy::NonRepeatable => {
                        return Err(SendError::Unknown(error));
                    }
                    _ => {
                        tracing::debug!(
                            member = %self.members[index].url,
                            %error,
                            ?fate,
                            "etcd: sending the request to the next member"
                        );
                        last = Some(error);
                    }
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            let now = Instant::now();
            let Some(last) = last else {
                // No member at all: cannot happen (connect refuses an empty list).
                return Err(SendError::Unreachable {
                    endpoints: self.endpoints.clone(),
                    budget: self.budget,
                    last: etcd_client::Error::InvalidArgs("no etcd member".into()),
                });
            };
            if now >= deadline {
                return Err(SendError::Unreachable {
                    endpoints: self.endpoints.clone(),
                    budget: self.budget,
                    last,
                });
            }
            round += 1;
            let pause = (ROUND_PAUSE * round).min(ROUND_PAUSE_MAX);
            tokio::time::sleep(pause.min(deadline - now)).await;
        }
    }
}

/// Tries member `index` with a linearizable read, after a pause that doubles each time it
/// fails, until it answers: then it rejoins the balance set. Ends when the store is gone.
async fn probe(members: Weak<Members>, index: usize) {
    let mut pause = PROBE_FIRST;
    loop {
        tokio::time::sleep(pause).await;
        let Some(members) = members.upgrade() else {
            return;
        };
        let member = &members.members[index];
        let answer = member
            .client
            .kv_client()
            .get(
                members.probe_key.clone(),
                Some(GetOptions::new().with_count_only()),
            )
            .await;
        match answer {
            Ok(_) => {
                // Probing ends first: a failure from now on starts a new probe.
                member.probing.store(false, Ordering::Release);
                member.up.store(true, Ordering::Release);
                tracing::info!(
                    member = %member.url,
                    "etcd: a member answers again and rejoins the balance set"
                );
                return;
            }
            Err(error) => {
                tracing::debug!(member = %member.url, %error, "etcd: a member still does not answer");
            }
        }
        pause = (pause * 2).min(PROBE_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    /// clientv3's `isSafeRetryMutableRPC` and `isSafeRetryImmutableRPC`, read from the
    /// errors etcd and tonic give: etcd's answers by their `etcdserver:` text, the
    /// require-leader refusal as handled by no one, and transport failures as unknown.
    #[test]
    fn errors_say_whether_the_request_may_have_reached_etcd() {
        for turned_away in [
            "etcdserver: no leader",
            "etcdserver: rpc not supported for learner",
        ] {
            assert_eq!(
                fate(&status(tonic::Code::Unavailable, turned_away)),
                Fate::TurnedAway,
                "{turned_away}"
            );
        }
        for unsure in [
            "etcdserver: leader changed",
            "etcdserver: request timed out",
            "etcdserver: request timed out, possibly due to previous leader failure",
        ] {
            assert_eq!(
                fate(&status(tonic::Code::Unavailable, unsure)),
                Fate::Unknown { broken: false },
                "{unsure}"
            );
        }
        assert_eq!(
            fate(&status(
                tonic::Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted"
            )),
            Fate::Answered
        );
        assert_eq!(
            fate(&status(tonic::Code::Unknown, "transport error")),
            Fate::Unknown { broken: true }
        );
        assert_eq!(
            fate(&status(tonic::Code::Cancelled, "Timeout expired")),
            Fate::Unknown { broken: true }
        );
        assert_eq!(
            fate(&status(tonic::Code::InvalidArgument, "anything")),
            Fate::Answered
        );
    }

    /// A refused connection is tonic's `ConnectError`: the request never left, so clientv3's
    /// retry interceptor sends it to another member, write or not.
    #[tokio::test]
    async fn a_refused_connection_is_a_request_never_sent() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let options = etcd_client::ConnectOptions::new()
            .with_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_secs(2));
        let mut client = Client::connect([format!("http://{closed}")], Some(options))
            .await
            .unwrap();
        let error = client.get("k", None).await.unwrap_err();
        assert_eq!(fate(&error), Fate::NotSent, "{error:?}");
    }

    /// The balancer's set: a member whose connection is refused leaves it (clientv3 picks
    /// only READY connections) and a probe starts trying it; a write that never left is sent
    /// to each member in turn, round after round, until the budget is spent.
    #[tokio::test]
    async fn a_refused_member_leaves_the_balance_set_and_a_write_goes_round_the_others() {
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let options = etcd_client::ConnectOptions::new()
            .with_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_secs(1));
        let client = Client::connect([format!("http://{closed}")], Some(options))
            .await
            .unwrap();
        let members = Members::new(
            vec![("a".into(), client.clone()), ("b".into(), client)],
            Duration::from_millis(300),
            b"probe".to_vec(),
        );
        let sent = std::sync::atomic::AtomicU32::new(0);
        let result: Result<(), SendError> = members
            .send(Policy::NonRepeatable, |mut client| {
                sent.fetch_add(1, Ordering::Relaxed);
                async move { client.get("k", None).await.map(|_| ()) }
            })
            .await;
        assert!(
            matches!(result, Err(SendError::Unreachable { .. })),
            "{result:?}"
        );
        assert!(
            sent.load(Ordering::Relaxed) >= 4,
            "a write that never left is sent again, to each member in turn"
        );
        assert!(!members.is_up(0) && !members.is_up(1));
        assert!(members.members[0].probing.load(Ordering::Acquire));
    }
}
