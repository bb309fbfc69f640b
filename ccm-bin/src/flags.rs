//! Flag value parsers shared by the subcommands, in upstream's formats.

use std::time::Duration;

/// Parses a non-negative Go-style duration as Kubernetes flags take them (`5s`, `1m30s`,
/// `500ms`), with the SDK's parser so `ccm` and the app entry read durations alike.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed = cloud_provider::app::options::parse_go_duration(text)?;
    if parsed.negative {
        return Err(format!("{text:?}: must not be negative"));
    }
    Ok(parsed.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "5", "s", "5x", "-5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
