//! Flag value parsers shared by the subcommands, in upstream's formats.

use std::time::Duration;

/// Parses a Go-style duration as Kubernetes flags take them: `5s`, `40s`, `1m30s`, `500ms`,
/// `2h`, `1.5s`. A bare `0` is zero.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{text:?}: missing unit (use ms, s, m or h, as in 5s)"))?;
        if number_len == 0 {
            return Err(format!("{text:?}: expected a number before {rest:?}"));
        }
        let value: f64 = rest[..number_len]
            .parse()
            .map_err(|_| format!("{text:?}: {:?} is not a number", &rest[..number_len]))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (use ms, s, m or h)"
                ));
            }
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(format!("{text:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "s", "5x", "-5s", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
