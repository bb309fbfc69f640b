//! `/healthz`, `/livez` and `/readyz` as `k8s.io/apiserver/pkg/server/healthz/healthz.go`
//! answers them: the server keeps its checks and runs them, these functions write the
//! answer.
//!
//! - The endpoint ([`aggregate`], `handleRootHealth`): `ok` when every check passes; with
//!   `?verbose` one `[+]<name> ok` line per check then `<endpoint> check passed`. Any failure
//!   makes it a 500 that is always verbose: `[-]<name> failed: reason withheld` (the reason is
//!   logged, not shown, as the endpoint is public) and `<endpoint> check failed`.
//!   `?exclude=<name>` skips a check (`[+]<name> excluded: ok`); names that match no check
//!   are listed in a `warn: some health checks cannot be excluded: no matches for "<name>"`
//!   line.
//! - One check's path ([`single`], `adaptCheckToHandler`): `ok`, or a 500
//!   `internal server error: <reason>`; an unknown name is Go's `404 page not found`.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// What the query string asks of a health endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthQuery {
    verbose: bool,
    exclude: Vec<String>,
}

impl HealthQuery {
    /// Reads `verbose` (present at all, whatever its value, as Go's `r.URL.Query()["verbose"]`)
    /// and every `exclude` from a raw query string.
    pub fn parse(query: Option<&str>) -> Self {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(query.unwrap_or("")).unwrap_or_default();
        let mut parsed = HealthQuery::default();
        for (key, value) in pairs {
            match key.as_str() {
                "verbose" => parsed.verbose = true,
                "exclude" if !parsed.exclude.contains(&value) => parsed.exclude.push(value),
                _ => {}
            }
        }
        parsed
    }

    /// Whether `?verbose` was given.
    pub fn verbose(&self) -> bool {
        self.verbose
    }

    /// Whether `?exclude=<name>` skips the check `name`.
    pub fn is_excluded(&self, name: &str) -> bool {
        self.exclude.iter().any(|e| e == name)
    }
}

/// A health endpoint's answer: a plain-text status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthResponse {
    /// 200, 500 or 404.
    pub status: StatusCode,
    /// The text.
    pub body: String,
}

impl IntoResponse for HealthResponse {
    /// `text/plain; charset=utf-8` with `X-Content-Type-Options: nosniff`, as Go's
    /// `http.Error` and healthz's success path set them.
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        response
    }
}

/// healthz.go `handleRootHealth`: runs `check` on each of `names` (in order) that `query`
/// does not exclude, and writes `endpoint`'s answer (see the module documentation). Failed
/// checks are logged with their reasons.
pub fn aggregate<'a>(
    endpoint: &str,
    query: &HealthQuery,
    names: impl IntoIterator<Item = &'a str>,
    mut check: impl FnMut(&str) -> Result<(), String>,
) -> HealthResponse {
    let mut lines = String::new();
    let mut unmatched: Vec<&str> = query.exclude.iter().map(String::as_str).collect();
    let mut failed = Vec::new();
    for name in names {
        if let Some(at) = unmatched.iter().position(|e| *e == name) {
            unmatched.remove(at);
            lines.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match check(name) {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(reason) => {
                lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
                failed.push(format!("{name}: {reason}"));
            }
        }
    }
    if !unmatched.is_empty() {
        unmatched.sort_unstable();
        let quoted: Vec<String> = unmatched.iter().map(|n| format!("{n:?}")).collect();
        lines.push_str(&format!(
            "warn: some health checks cannot be excluded: no matches for {}\n",
            quoted.join(",")
        ));
    }
    if !failed.is_empty() {
        tracing::warn!(endpoint, ?failed, "{endpoint} check failed");
        return HealthResponse {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: format!("{lines}{endpoint} check failed\n"),
        };
    }
    let body = if query.verbose {
        format!("{lines}{endpoint} check passed\n")
    } else {
        "ok".to_owned()
    };
    HealthResponse {
        status: StatusCode::OK,
        body,
    }
}

/// healthz.go `adaptCheckToHandler`: the answer of one check's own path, given its result,
/// or `None` when no check has that name (Go's mux: `404 page not found`).
pub fn single(result: Option<Result<(), String>>) -> HealthResponse {
    match result {
        None => HealthResponse {
            status: StatusCode::NOT_FOUND,
            body: "404 page not found\n".to_owned(),
        },
        Some(Ok(())) => HealthResponse {
            status: StatusCode::OK,
            body: "ok".to_owned(),
        },
        Some(Err(reason)) => HealthResponse {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: format!("internal server error: {reason}\n"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(query: &str, failing: &[&str]) -> HealthResponse {
        aggregate(
            "livez",
            &HealthQuery::parse(Some(query)),
            ["ping", "etcd", "informer-sync"],
            |name| {
                if failing.contains(&name) {
                    Err(format!("{name} is down"))
                } else {
                    Ok(())
                }
            },
        )
    }

    /// healthz.go `handleRootHealth`: `ok` unless `?verbose`, then one line per check and
    /// `<name> check passed`.
    #[test]
    fn passing_checks_answer_ok_or_the_verbose_list() {
        assert_eq!(
            run("", &[]),
            HealthResponse {
                status: StatusCode::OK,
                body: "ok".into()
            }
        );
        let verbose = "[+]ping ok\n[+]etcd ok\n[+]informer-sync ok\nlivez check passed\n";
        assert_eq!(run("verbose", &[]).body, verbose);
        assert_eq!(run("verbose=1", &[]).body, verbose);
        // Go looks for the key only: `verbose=false` is verbose too.
        assert_eq!(run("verbose=false", &[]).body, verbose);
    }

    /// `handleRootHealth`: a failure is always verbose, a 500, and withholds its reason.
    #[test]
    fn a_failed_check_is_a_500_that_withholds_its_reason() {
        let answer = run("", &["etcd"]);
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            answer.body,
            "[+]ping ok\n[-]etcd failed: reason withheld\n[+]informer-sync ok\nlivez check failed\n"
        );
        assert!(!answer.body.contains("is down"));
    }

    /// `handleRootHealth` / `getExcludedChecks`: excluded checks are not run and say so in
    /// place; exclusions matching no check are named in a warning line, sorted and quoted.
    #[test]
    fn excluded_checks_are_skipped_and_unknown_exclusions_warned_about() {
        let answer = run("exclude=etcd&verbose", &["etcd"]);
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(
            answer.body,
            "[+]ping ok\n[+]etcd excluded: ok\n[+]informer-sync ok\nlivez check passed\n"
        );
        assert_eq!(run("exclude=etcd", &["etcd"]).body, "ok");
        let answer = run("exclude=zeta&exclude=alpha&exclude=ping&verbose", &[]);
        assert_eq!(
            answer.body,
            "[+]ping excluded: ok\n[+]etcd ok\n[+]informer-sync ok\nwarn: some health checks cannot be excluded: no matches for \"alpha\",\"zeta\"\nlivez check passed\n"
        );
        // Query values are URL-decoded.
        assert!(HealthQuery::parse(Some("exclude=informer%2Dsync")).is_excluded("informer-sync"));
    }

    /// healthz.go `adaptCheckToHandler` and Go's mux for an unknown check.
    #[test]
    fn one_check_path_shows_its_reason() {
        assert_eq!(single(Some(Ok(()))).body, "ok");
        let failed = single(Some(Err("lease overdue".into())));
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.body, "internal server error: lease overdue\n");
        assert_eq!(single(None).status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn answers_are_plain_text_and_not_sniffed() {
        let response = single(None).into_response();
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            response.headers()[header::X_CONTENT_TYPE_OPTIONS],
            "nosniff"
        );
    }
}
