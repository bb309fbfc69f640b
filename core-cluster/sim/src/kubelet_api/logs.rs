//! What a simulated container writes to its log, and `/containerLogs` over it.
//!
//! A container's log is a pure function of its start time and the pod's annotations, so
//! nothing is buffered: line 0 is the lifecycle line kubelet's runtime would show first
//! ("Started container …"), and with [`LOG_TEMPLATE_ANNOTATION`] line `n ≥ 1` is the
//! template written `n` × [`LOG_INTERVAL_ANNOTATION`] after the start, as kwok's `Logs`
//! stage replays a file. A follower is a stream computed line by line as its reader asks
//! for more: a slow reader holds one line at most, and a reader that goes away drops the
//! stream and its timer.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use jiff::{SignedDuration, Timestamp};

/// Pod annotation: a log line the pod's containers write every interval. `{n}` (line
/// number), `{pod}`, `{namespace}`, `{container}` and `{node}` are substituted.
pub const LOG_TEMPLATE_ANNOTATION: &str = "sim.ccm-rs.io/log-template";
/// Pod annotation: the interval between template lines (`500ms`, `2s`, `1m`; default 1 s).
pub const LOG_INTERVAL_ANNOTATION: &str = "sim.ccm-rs.io/log-interval";
/// The interval when [`LOG_INTERVAL_ANNOTATION`] is absent or unreadable.
pub const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The log of one container instance.
#[derive(Debug, Clone)]
pub(crate) struct ContainerLog {
    /// When the instance started: the time of line 0.
    pub(crate) started: Timestamp,
    /// The first line ("Started container …").
    pub(crate) first: String,
    /// The template of the following lines, already holding every name but `{n}`.
    pub(crate) template: Option<String>,
    /// Time between template lines (> 0).
    pub(crate) interval: Duration,
    /// A terminated instance: its last line and when it was written. No line after it.
    pub(crate) ended: Option<(Timestamp, String)>,
}

/// Counts a log stream while it is open (dropped with the stream, when its reader is done
/// or gone).
#[derive(Debug)]
pub(crate) struct StreamGuard(Arc<AtomicUsize>);

impl StreamGuard {
    pub(crate) fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        StreamGuard(open.clone())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// kubelet's `PodLogOptions` as `/containerLogs` reads them from the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogOptions {
    pub(crate) follow: bool,
    pub(crate) previous: bool,
    pub(crate) timestamps: bool,
    pub(crate) tail_lines: Option<u64>,
    pub(crate) since: Option<Timestamp>,
    pub(crate) limit_bytes: Option<u64>,
}

fn flag(v: &str) -> Result<bool, String> {
    match v {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(format!("invalid boolean value {other:?}")),
    }
}

impl LogOptions {
    /// Reads the query as kubelet's `getContainerLogs` decodes `PodLogOptions`, with the
    /// same checks as `pkg/apis/core/validation ValidatePodLogOptions` (negative numbers,
    /// both `sinceSeconds` and `sinceTime`).
    pub(crate) fn parse(
        query: &std::collections::HashMap<String, String>,
        now: Timestamp,
    ) -> Result<Self, String> {
        let mut o = LogOptions::default();
        let number = |k: &str| -> Result<Option<i64>, String> {
            query
                .get(k)
                .map(|v| {
                    v.parse::<i64>()
                        .map_err(|_| format!("{k}: invalid value {v:?}: must be an integer"))
                })
                .transpose()
        };
        if let Some(v) = query.get("follow") {
            o.follow = flag(v)?;
        }
        if let Some(v) = query.get("previous") {
            o.previous = flag(v)?;
        }
        if let Some(v) = query.get("timestamps") {
            o.timestamps = flag(v)?;
        }
        if let Some(n) = number("tailLines")? {
            if n < 0 {
                return Err("tailLines: Invalid value: must be greater than or equal to 0".into());
            }
            o.tail_lines = Some(n as u64);
        }
        if let Some(n) = number("limitBytes")? {
            if n < 1 {
                return Err("limitBytes: Invalid value: must be greater than 0".into());
            }
            o.limit_bytes = Some(n as u64);
        }
        let since_seconds = number("sinceSeconds")?;
        let since_time = query.get("sinceTime");
        if since_seconds.is_some() && since_time.is_some() {
            return Err("at most one of `sinceTime` or `sinceSeconds` may be specified".into());
        }
        if let Some(s) = since_seconds {
            if s < 1 {
                return Err("sinceSeconds: Invalid value: must be greater than 0".into());
            }
            o.since = now.checked_sub(SignedDuration::from_secs(s)).ok();
        }
        if let Some(t) = since_time {
            o.since = Some(
                t.parse::<Timestamp>()
                    .map_err(|e| format!("sinceTime: invalid time {t:?}: {e}"))?,
            );
        }
        Ok(o)
    }
}

impl ContainerLog {
    /// When line `n` is written.
    fn time_of(&self, n: u64) -> Timestamp {
        let offset = self
            .interval
            .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
        let offset = SignedDuration::try_from(offset).unwrap_or(SignedDuration::MAX);
        self.started.checked_add(offset).unwrap_or(Timestamp::MAX)
    }

    /// How many numbered lines (line 0 and template lines) exist at `now`.
    fn numbered_lines_at(&self, now: Timestamp) -> u64 {
        let until = match &self.ended {
            Some((end, _)) if *end < now => *end,
            _ => now,
        };
        if until < self.started {
            return 0;
        }
        if self.template.is_none() {
            return 1;
        }
        let elapsed = until.duration_since(self.started).unsigned_abs();
        1 + (elapsed.as_nanos() / self.interval.as_nanos().max(1)) as u64
    }

    /// The first numbered line written at or after `t`.
    fn first_line_since(&self, t: Timestamp) -> u64 {
        if t <= self.started {
            return 0;
        }
        if self.template.is_none() {
            return 1;
        }
        let elapsed = t.duration_since(self.started).unsigned_abs();
        let step = self.interval.as_nanos().max(1);
        elapsed.as_nanos().div_ceil(step) as u64
    }

    fn text_of(&self, n: u64) -> String {
        match (n, &self.template) {
            (0, _) => self.first.clone(),
            (_, Some(t)) => t.replace("{n}", &n.to_string()),
            (_, None) => String::new(),
        }
    }

    fn render(&self, time: Timestamp, text: &str, timestamps: bool) -> Bytes {
        if timestamps {
            // RFC 3339 with nanoseconds, as the CRI log parser's `RFC3339NanoFixed`.
            let t = time.strftime("%Y-%m-%dT%H:%M:%S.%9fZ");
            Bytes::from(format!("{t} {text}\n"))
        } else {
            Bytes::from(format!("{text}\n"))
        }
    }

    /// The lines `first..count` already written, then (with `follow`) each next line when
    /// it is written, until the instance ends. `limit_bytes` cuts the whole stream.
    pub(crate) fn stream(
        self,
        options: &LogOptions,
        now: Timestamp,
        clock: crate::clock::WallClock,
        guard: StreamGuard,
    ) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static {
        let count = self.numbered_lines_at(now);
        let mut first = options
            .since
            .map_or(0, |since| self.first_line_since(since));
        // The terminated instance's last line counts as one more.
        let end_line = self.ended.as_ref().filter(|(end, _)| *end <= now).cloned();
        let total = count + u64::from(end_line.is_some());
        if let Some(tail) = options.tail_lines {
            first = first.max(total.saturating_sub(tail));
        }
        let state = FollowState {
            log: self,
            next: first,
            count,
            end_written: false,
            end_line,
            follow: options.follow,
            timestamps: options.timestamps,
            left: options.limit_bytes,
            clock,
            _guard: guard,
        };
        futures::stream::unfold(state, |mut s| async move {
            let mut chunk = s.next_line().await?;
            if let Some(left) = s.left.as_mut() {
                if *left == 0 {
                    return None;
                }
                if chunk.len() as u64 > *left {
                    chunk = chunk.slice(..*left as usize);
                }
                *left -= chunk.len() as u64;
            }
            Some((Ok(chunk), s))
        })
    }
}

struct FollowState {
    log: ContainerLog,
    /// The next numbered line to send.
    next: u64,
    /// Numbered lines known to exist.
    count: u64,
    end_written: bool,
    end_line: Option<(Timestamp, String)>,
    follow: bool,
    timestamps: bool,
    left: Option<u64>,
    clock: crate::clock::WallClock,
    _guard: StreamGuard,
}

impl FollowState {
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if self.next < self.count {
                let n = self.next;
                self.next += 1;
                let text = self.log.text_of(n);
                return Some(self.log.render(self.log.time_of(n), &text, self.timestamps));
            }
            if let Some((t, text)) = self.end_line.clone() {
                if self.end_written {
                    return None;
                }
                self.end_written = true;
                if self.next > self.count {
                    // Cut by tailLines or since past it.
                    return None;
                }
                return Some(self.log.render(t, &text, self.timestamps));
            }
            if !self.follow || self.log.template.is_none() {
                return None;
            }
            // Wait for the next line, by the tokio clock.
            let due = self.log.time_of(self.count);
            let now = self.clock.now();
            if due > now {
                let wait = due.duration_since(now).unsigned_abs();
                tokio::time::sleep(wait).await;
            }
            self.count = self
                .log
                .numbered_lines_at(self.clock.now())
                .max(self.count + 1);
        }
    }
}

/// Reads the interval annotation (`500ms`, `2s`, `1m`); `None` when unreadable or zero.
pub(crate) fn parse_interval(value: &str) -> Option<Duration> {
    let v = value.trim();
    let (number, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = number.parse().ok()?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        _ => return None,
    };
    (!d.is_zero()).then_some(d)
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn log(template: bool) -> ContainerLog {
        ContainerLog {
            started: "2026-01-01T00:00:00Z".parse().unwrap(),
            first: "Started container app".into(),
            template: template.then(|| "tick {n}".to_owned()),
            interval: Duration::from_secs(1),
            ended: None,
        }
    }

    async fn collect(log: ContainerLog, options: &LogOptions, now_secs: i64) -> Vec<String> {
        let now = log.started + SignedDuration::from_secs(now_secs);
        let s: Vec<_> = log
            .stream(
                options,
                now,
                crate::clock::WallClock::new(),
                StreamGuard::new(&Arc::default()),
            )
            .collect()
            .await;
        let text: String = s
            .into_iter()
            .map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap())
            .collect();
        text.lines().map(str::to_owned).collect()
    }

    /// kubelet `getContainerLogs`: without follow the log so far, line by line in order.
    #[tokio::test]
    async fn the_log_so_far_is_the_start_line_then_one_template_line_per_interval() {
        let lines = collect(log(true), &LogOptions::default(), 3).await;
        assert_eq!(
            lines,
            ["Started container app", "tick 1", "tick 2", "tick 3"]
        );
        let lines = collect(log(false), &LogOptions::default(), 3).await;
        assert_eq!(lines, ["Started container app"]);
    }

    /// `PodLogOptions.tailLines`, `sinceSeconds` and `limitBytes` as the CRI log reader
    /// (`pkg/kubelet/kuberuntime/logs ReadLogs`) applies them.
    #[tokio::test]
    async fn tail_since_and_limit_cut_the_log_as_kubelets_reader_does() {
        let tail = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        assert_eq!(collect(log(true), &tail, 5).await, ["tick 4", "tick 5"]);
        let since = LogOptions {
            since: Some(log(true).started + SignedDuration::from_millis(2500)),
            ..LogOptions::default()
        };
        assert_eq!(collect(log(true), &since, 4).await, ["tick 3", "tick 4"]);
        let limit = LogOptions {
            limit_bytes: Some(10),
            ..LogOptions::default()
        };
        assert_eq!(collect(log(true), &limit, 4).await, ["Started co"]);
        let stamped = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..LogOptions::default()
        };
        assert_eq!(
            collect(log(true), &stamped, 1).await,
            ["2026-01-01T00:00:01.000000000Z tick 1"]
        );
    }

    /// A terminated instance ends with its last line, and follow stops there.
    #[tokio::test]
    async fn an_ended_container_log_ends_with_its_exit_line_even_when_followed() {
        let mut l = log(true);
        l.ended = Some((
            l.started + SignedDuration::from_secs(2),
            "Container app exited with code 3".into(),
        ));
        let follow = LogOptions {
            follow: true,
            ..LogOptions::default()
        };
        let lines = collect(l, &follow, 10).await;
        assert_eq!(
            lines,
            [
                "Started container app",
                "tick 1",
                "tick 2",
                "Container app exited with code 3"
            ]
        );
    }

    /// `ValidatePodLogOptions`: negative numbers and both since forms are refused.
    #[test]
    fn bad_log_options_are_refused_with_upstreams_reasons() {
        let now = Timestamp::now();
        let q = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<std::collections::HashMap<_, _>>()
        };
        assert!(LogOptions::parse(&q(&[("tailLines", "-1")]), now).is_err());
        assert!(LogOptions::parse(&q(&[("limitBytes", "0")]), now).is_err());
        assert!(LogOptions::parse(&q(&[("tailLines", "x")]), now).is_err());
        let both = LogOptions::parse(
            &q(&[("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")]),
            now,
        )
        .unwrap_err();
        assert!(both.contains("at most one"), "{both}");
        let ok = LogOptions::parse(&q(&[("follow", "true"), ("tailLines", "3")]), now).unwrap();
        assert!(ok.follow && ok.tail_lines == Some(3));
    }

    #[test]
    fn intervals_read_milliseconds_seconds_and_minutes() {
        assert_eq!(parse_interval("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_interval("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_interval("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_interval("1m"), Some(Duration::from_secs(60)));
        assert_eq!(parse_interval("0s"), None);
        assert_eq!(parse_interval("soon"), None);
    }
}
