//! The one error type that cloud providers return, and kind matching that sees through wrapping.
//!
//! Upstream Go compares sentinel errors with `==`, so a provider that wraps `InstanceNotFound`
//! (`fmt.Errorf("lookup: %w", cloudprovider.InstanceNotFound)`) is silently treated as a generic
//! failure. Here every check goes through [`CloudError::kind`], which walks the whole
//! [`source`](std::error::Error::source) chain, so wrapping never hides a kind.

use std::{error::Error as StdError, fmt, time::Duration};

/// A boxed error that can cross threads: the source of [`CloudError::Other`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// The error every [`CloudProvider`](crate::CloudProvider) method returns.
///
/// Build the well-known kinds with their variants, and anything else with
/// [`CloudError::other`] or [`CloudError::context`], which keep the underlying error as the
/// source.
///
/// ```
/// use cloud_provider::{CloudError, ErrorKind};
///
/// // A provider wraps a lookup failure with context...
/// let err = CloudError::context("describe instance i-123", CloudError::InstanceNotFound);
/// // ...and the controllers still see the kind.
/// assert_eq!(err.kind(), ErrorKind::InstanceNotFound);
/// assert!(err.is_instance_not_found());
/// assert_eq!(err.to_string(), "describe instance i-123: instance not found");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudError {
    /// The instance does not exist in the cloud. Must not be returned for stopped instances.
    #[error("instance not found")]
    InstanceNotFound,

    /// The provider does not implement this call.
    #[error("unimplemented")]
    NotImplemented,

    /// Another controller implements this (for example a dedicated load-balancer controller).
    /// The service controller keeps its finalizer but does not write status.
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,

    /// Ask the caller to retry after a fixed delay instead of its exponential backoff.
    #[error("{message} (retry after {}s)", retry_after.as_secs_f64())]
    RetryAfter {
        /// How long to wait before retrying.
        retry_after: Duration,
        /// Why.
        message: String,
    },

    /// The cloud refused the call because its API quota is spent (HTTP 429, AWS
    /// `RequestLimitExceeded`, Azure `TooManyRequests`). The shared cloud rate limiter lowers
    /// its rate when it sees this kind, and holds every caller back for `retry_after` when the
    /// cloud said how long.
    #[error("{message} (throttled{})", retry_after.map(|d| format!(", retry after {}s", d.as_secs_f64())).unwrap_or_default())]
    Throttled {
        /// How long the cloud asked callers to wait, when it said.
        retry_after: Option<Duration>,
        /// Why.
        message: String,
    },

    /// Any other failure, with what was being done and the underlying error.
    #[error("{context}: {source}")]
    Other {
        /// What was being done, e.g. `describe instances`.
        context: String,
        /// The underlying error. It may itself be (or wrap) a `CloudError`.
        #[source]
        source: BoxError,
    },

    /// A failure with a message and no underlying error.
    #[error("{0}")]
    Message(String),
}

/// The kind of a [`CloudError`], found through any wrapping. Match on this, not on variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`CloudError::InstanceNotFound`].
    InstanceNotFound,
    /// See [`CloudError::NotImplemented`].
    NotImplemented,
    /// See [`CloudError::ImplementedElsewhere`].
    ImplementedElsewhere,
    /// See [`CloudError::RetryAfter`].
    RetryAfter,
    /// See [`CloudError::Throttled`].
    Throttled,
    /// Anything else.
    Other,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::InstanceNotFound => "InstanceNotFound",
            ErrorKind::NotImplemented => "NotImplemented",
            ErrorKind::ImplementedElsewhere => "ImplementedElsewhere",
            ErrorKind::RetryAfter => "RetryAfter",
            ErrorKind::Throttled => "Throttled",
            ErrorKind::Other => "Other",
        })
    }
}

impl CloudError {
    /// A retry-after error: the caller should retry after `retry_after`, not back off.
    pub fn retry_after(retry_after: Duration, message: impl Into<String>) -> Self {
        CloudError::RetryAfter {
            retry_after,
            message: message.into(),
        }
    }

    /// A throttling error: the cloud's API quota is spent; `retry_after` is how long the cloud
    /// asked callers to wait, when it said.
    pub fn throttled(retry_after: Option<Duration>, message: impl Into<String>) -> Self {
        CloudError::Throttled {
            retry_after,
            message: message.into(),
        }
    }

    /// Wraps any error with what was being done. Kinds inside `source` stay visible.
    pub fn context(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        CloudError::Other {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Wraps any error without extra context.
    pub fn other(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        CloudError::Other {
            context: "cloud provider error".to_owned(),
            source,
        }
    }

    /// A plain message.
    pub fn message(message: impl Into<String>) -> Self {
        CloudError::Message(message.into())
    }

    /// This error's own kind, ignoring anything it wraps.
    fn own_kind(&self) -> ErrorKind {
        match self {
            CloudError::InstanceNotFound => ErrorKind::InstanceNotFound,
            CloudError::NotImplemented => ErrorKind::NotImplemented,
            CloudError::ImplementedElsewhere => ErrorKind::ImplementedElsewhere,
            CloudError::RetryAfter { .. } => ErrorKind::RetryAfter,
            CloudError::Throttled { .. } => ErrorKind::Throttled,
            CloudError::Other { .. } | CloudError::Message(_) => ErrorKind::Other,
        }
    }

    /// The first well-known kind found in this error or anything it wraps, else
    /// [`ErrorKind::Other`].
    pub fn kind(&self) -> ErrorKind {
        kind_of(self)
    }

    /// Whether this error, or anything it wraps, says the instance does not exist.
    pub fn is_instance_not_found(&self) -> bool {
        self.kind() == ErrorKind::InstanceNotFound
    }

    /// Whether this error, or anything it wraps, says the call is not implemented.
    pub fn is_not_implemented(&self) -> bool {
        self.kind() == ErrorKind::NotImplemented
    }

    /// Whether this error, or anything it wraps, says another controller implements this.
    pub fn is_implemented_elsewhere(&self) -> bool {
        self.kind() == ErrorKind::ImplementedElsewhere
    }

    /// Whether this error, or anything it wraps, says the cloud throttled the call.
    pub fn is_throttled(&self) -> bool {
        self.kind() == ErrorKind::Throttled
    }

    /// The retry delay asked for by this error or anything it wraps (a retry-after error's,
    /// or a throttling error's when the cloud said how long).
    pub fn retry_after_delay(&self) -> Option<Duration> {
        retry_after_of(self)
    }
}

/// Walks `err` and its sources and yields every [`CloudError`] found, outermost first.
fn cloud_errors<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a CloudError> + 'a {
    let mut next = Some(err);
    std::iter::from_fn(move || {
        let current = next?;
        // `io::Error::source` skips the error it wraps; look at that error itself.
        next = match current
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => current.source(),
        };
        Some(current)
    })
    .filter_map(|e| e.downcast_ref::<CloudError>())
}

/// The first well-known [`ErrorKind`] in `err` or its source chain, else [`ErrorKind::Other`].
///
/// Works on any error type, so a `CloudError` inside an `io::Error`, an `anyhow::Error` (via
/// `as_ref()`) or a provider's own error type is still recognised.
///
/// ```
/// use cloud_provider::{error::kind_of, CloudError, ErrorKind};
///
/// // An io::Error wrapping a CloudError (io::Error hides it from `source()`; we look anyway).
/// let io = std::io::Error::other(CloudError::NotImplemented);
/// assert_eq!(kind_of(&io), ErrorKind::NotImplemented);
/// ```
pub fn kind_of(err: &(dyn StdError + 'static)) -> ErrorKind {
    cloud_errors(err)
        .map(CloudError::own_kind)
        .find(|k| *k != ErrorKind::Other)
        .unwrap_or(ErrorKind::Other)
}

/// The retry-after delay in `err` or its source chain, if any: a retry-after error's, or a
/// throttling error's when the cloud said how long.
pub fn retry_after_of(err: &(dyn StdError + 'static)) -> Option<Duration> {
    cloud_errors(err).find_map(|e| match e {
        CloudError::RetryAfter { retry_after, .. } => Some(*retry_after),
        CloudError::Throttled { retry_after, .. } => *retry_after,
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("vendor error")]
    struct VendorError(#[source] CloudError);

    #[test]
    fn bare_kinds() {
        assert_eq!(
            CloudError::InstanceNotFound.kind(),
            ErrorKind::InstanceNotFound
        );
        assert_eq!(CloudError::NotImplemented.kind(), ErrorKind::NotImplemented);
        assert_eq!(
            CloudError::ImplementedElsewhere.kind(),
            ErrorKind::ImplementedElsewhere
        );
        assert_eq!(CloudError::message("x").kind(), ErrorKind::Other);
        assert_eq!(
            CloudError::retry_after(Duration::from_secs(3), "busy").kind(),
            ErrorKind::RetryAfter
        );
    }

    #[test]
    fn kinds_survive_any_depth_of_wrapping() {
        // Upstream compares sentinels with `==`; a wrapped one is missed. Ours is found.
        let wrapped = CloudError::context(
            "outer",
            CloudError::context("middle", VendorError(CloudError::InstanceNotFound)),
        );
        assert!(wrapped.is_instance_not_found());
        let io = std::io::Error::other(CloudError::context("x", CloudError::ImplementedElsewhere));
        assert_eq!(kind_of(&io), ErrorKind::ImplementedElsewhere);
    }

    #[test]
    fn retry_after_found_through_wrapping() {
        let err = CloudError::context(
            "ensure lb",
            CloudError::retry_after(Duration::from_secs(42), "quota"),
        );
        assert_eq!(err.kind(), ErrorKind::RetryAfter);
        assert_eq!(err.retry_after_delay(), Some(Duration::from_secs(42)));
        assert_eq!(CloudError::message("plain").retry_after_delay(), None);
    }

    /// A throttling error is its own kind through any wrapping, and carries the cloud's
    /// retry-after when it gave one (the shared limiter backs off on it).
    #[test]
    fn throttling_is_a_kind_found_through_wrapping() {
        let err = CloudError::context(
            "update lb",
            CloudError::throttled(Some(Duration::from_millis(500)), "RequestLimitExceeded"),
        );
        assert_eq!(err.kind(), ErrorKind::Throttled);
        assert!(err.is_throttled());
        assert_eq!(err.retry_after_delay(), Some(Duration::from_millis(500)));
        let bare = CloudError::throttled(None, "429");
        assert_eq!(bare.retry_after_delay(), None);
        assert_eq!(bare.to_string(), "429 (throttled)");
        assert_eq!(
            err.to_string(),
            "update lb: RequestLimitExceeded (throttled, retry after 0.5s)"
        );
        assert!(!CloudError::retry_after(Duration::from_secs(1), "x").is_throttled());
    }

    #[test]
    fn other_without_kind_is_other() {
        let err = CloudError::context("x", std::io::Error::other("disk on fire"));
        assert_eq!(err.kind(), ErrorKind::Other);
        assert_eq!(err.to_string(), "x: disk on fire");
    }

    #[test]
    fn messages_match_upstream_sentinels() {
        assert_eq!(CloudError::NotImplemented.to_string(), "unimplemented");
        assert_eq!(
            CloudError::ImplementedElsewhere.to_string(),
            "implemented by alternate to cloud provider"
        );
        assert_eq!(
            CloudError::InstanceNotFound.to_string(),
            "instance not found"
        );
        assert_eq!(
            CloudError::retry_after(Duration::from_millis(1500), "throttled").to_string(),
            "throttled (retry after 1.5s)"
        );
    }
}
