//! Kubernetes resource quantities (`100m`, `1.5Gi`, `5e15`, `9Ei`), parsed as upstream's
//! `k8s.io/apimachinery/pkg/api/resource` `ParseQuantity` parses them. This is the one
//! parser: API validation and the scheduler both read quantities through it.
//!
//! A quantity is a signed number with a suffix: binary (`Ki` `Mi` `Gi` `Ti` `Pi` `Ei`),
//! decimal (`n` `u` `m` `` `k` `M` `G` `T` `P` `E`) or a decimal exponent (`e3`, `E-2`).
//! As upstream, values are rounded up (away from zero) to a whole nano and capped at the
//! largest int64 in base units, so no quantity can overflow what reads it.

use serde_json::Value;

/// Why a string is not a quantity (upstream's `ErrFormatWrong`, `ErrSuffix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Upstream `ErrFormatWrong`.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    /// Upstream `ErrSuffix`.
    #[error("unable to parse quantity's suffix")]
    Suffix,
}

/// Nanos in one base unit.
const NANO: i128 = 1_000_000_000;
/// The largest magnitude, in nanos: upstream caps quantities at the largest int64 in base
/// units (`maxAllowed`).
const MAX_NANOS: i128 = i64::MAX as i128 * NANO;

/// A parsed quantity: an exact number of nanos of the base unit (cores, bytes, pods).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// The largest quantity there is: the largest int64 in base units.
    pub const MAX: Quantity = Quantity { nanos: MAX_NANOS };

    /// The quantity in nanos of the base unit.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// Upstream `Value()`: whole base units, rounded up, saturating at the int64 range.
    pub fn value(&self) -> i64 {
        scaled(self.nanos, NANO)
    }

    /// Upstream `MilliValue()`: thousandths of the base unit (millicores), rounded up,
    /// saturating at the int64 range where upstream's int64 would overflow.
    pub fn milli_value(&self) -> i64 {
        scaled(self.nanos, 1_000_000)
    }
}

/// `nanos / per`, rounded toward positive infinity, clamped to the int64 range.
fn scaled(nanos: i128, per: i128) -> i64 {
    let q = nanos.div_euclid(per) + i128::from(nanos.rem_euclid(per) != 0);
    i64::try_from(q).unwrap_or(if q < 0 { i64::MIN } else { i64::MAX })
}

/// Parses `s` as upstream's JSON decoding of a quantity does (`strings.TrimSpace`, then
/// `ParseQuantity`), following its grammar character for character
/// (`parseQuantityString`): an optional sign, digits with an optional fraction, then a
/// suffix.
pub fn parse_quantity(s: &str) -> Result<Quantity, QuantityError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(QuantityError::Format);
    }
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut negative = false;
    match b[0] {
        b'-' => {
            negative = true;
            pos = 1;
        }
        b'+' => pos = 1,
        _ => {}
    }
    while pos < end && b[pos] == b'0' {
        pos += 1;
    }
    let digits_at = |mut p: usize| {
        while p < end && b[p].is_ascii_digit() {
            p += 1;
        }
        p
    };
    let num_end = digits_at(pos);
    let num = &s[pos..num_end];
    pos = num_end;
    let mut denom = "";
    if pos < end && b[pos] == b'.' {
        let denom_end = digits_at(pos + 1);
        denom = &s[pos + 1..denom_end];
        pos = denom_end;
    }
    let suffix_start = pos;
    while pos < end && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < end && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    if digits_at(pos) != end {
        return Err(QuantityError::Format);
    }
    let (base10, base2) = interpret(&s[suffix_start..]).ok_or(QuantityError::Suffix)?;
    // The value is (num.denom) × 10^base10 × 2^base2, in nanos 10^9 more.
    let mut digits = format!("{num}{denom}");
    let mut exponent = i128::from(base10) + 9 - denom.len() as i128;
    let significant = digits.trim_start_matches('0').len();
    digits.drain(..digits.len() - significant);
    let kept = digits.trim_end_matches('0').len();
    exponent += (digits.len() - kept) as i128;
    digits.truncate(kept);
    let magnitude = nanos_of(&digits, exponent, base2);
    Ok(Quantity {
        nanos: if negative { -magnitude } else { magnitude },
    })
}

/// Upstream `suffixer.interpret`: the power of ten and the power of two a suffix means.
fn interpret(suffix: &str) -> Option<(i32, u32)> {
    let decimal = |e| Some((e, 0));
    let binary = |e| Some((0, e));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ if suffix.len() > 1 && suffix.starts_with(['e', 'E']) => {
            // Upstream parses an int64 and keeps its low 32 bits (`int32(parsed)`).
            let parsed: i64 = suffix[1..].parse().ok()?;
            decimal(parsed as i32)
        }
        _ => None,
    }
}

/// `digits × 10^exponent × 2^base2` rounded up to a whole number and capped at
/// [`MAX_NANOS`]. `digits` has no leading or trailing zeros (empty is zero); the work is
/// linear in its length whatever the exponent.
fn nanos_of(digits: &str, exponent: i128, base2: u32) -> i128 {
    if digits.is_empty() {
        return 0;
    }
    let n = digits.len() as i128;
    // At least 10^(n-1+exponent): from 10^28 on it is past the cap (about 9.2 × 10^27).
    if n - 1 + exponent >= 28 {
        return MAX_NANOS;
    }
    let pow2 = 1u128 << base2;
    let parse = |d: &str| -> u128 { d.bytes().fold(0, |v, c| v * 10 + u128::from(c - b'0')) };
    let total = if exponent >= 0 {
        // n + exponent ≤ 28: below 10^28, no overflow before the power of two.
        (parse(digits) * 10u128.pow(exponent as u32)).checked_mul(pow2)
    } else {
        // Split at the decimal point: whole part × 2^base2 plus the fraction's product,
        // rounded up.
        let point = (n + exponent).max(0) as usize;
        let whole = parse(&digits[..point]);
        let fraction = &digits[point..];
        let mut zeros = (-exponent) - fraction.len() as i128;
        let (mut carry, mut inexact) = (0u128, false);
        for c in fraction.bytes().rev() {
            let t = u128::from(c - b'0') * pow2 + carry;
            inexact |= !t.is_multiple_of(10);
            carry = t / 10;
        }
        // Leading zeros of the fraction only divide the carry by ten each.
        while carry > 0 && zeros > 0 {
            inexact |= !carry.is_multiple_of(10);
            carry /= 10;
            zeros -= 1;
        }
        whole
            .checked_mul(pow2)
            .and_then(|w| w.checked_add(carry + u128::from(inexact)))
    };
    total.map_or(MAX_NANOS, |t| t.min(MAX_NANOS as u128) as i128)
}

/// The quantity at `v` when it is a string that parses.
pub fn quantity_of(v: &Value) -> Option<Quantity> {
    parse_quantity(v.as_str()?).ok()
}

/// What upstream's decoder refuses in a pod spec: a resource quantity (of a container's,
/// init container's or ephemeral container's requests or limits, or of the pod overhead)
/// that is not a quantity. The message is the decoding error's.
pub fn check_pod_spec_quantities(spec: &Value) -> Result<(), QuantityError> {
    let maps = ["containers", "initContainers", "ephemeralContainers"]
        .into_iter()
        .filter_map(|list| spec[list].as_array())
        .flatten()
        .flat_map(|c| [&c["resources"]["requests"], &c["resources"]["limits"]])
        .chain([&spec["overhead"]]);
    for map in maps.filter_map(Value::as_object) {
        for q in map.values().filter_map(Value::as_str) {
            parse_quantity(q)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nanos(s: &str) -> i128 {
        parse_quantity(s).unwrap().nanos()
    }

    /// Upstream `resource.ParseQuantity`: every suffix, fractions, exponents with a sign.
    #[test]
    fn parses_every_suffix_as_upstream() {
        assert_eq!(nanos("100m"), 100_000_000);
        assert_eq!(nanos("2"), 2 * NANO);
        assert_eq!(nanos("1.5"), 1_500_000_000);
        assert_eq!(nanos("128Mi"), 134_217_728 * NANO);
        assert_eq!(nanos("1.5Gi"), 1_610_612_736 * NANO);
        assert_eq!(nanos("1G"), 1_000_000_000 * NANO);
        assert_eq!(nanos("1e3"), 1000 * NANO);
        assert_eq!(nanos("1E3"), 1000 * NANO);
        assert_eq!(nanos("1e-3"), 1_000_000);
        assert_eq!(nanos("25e+2"), 2500 * NANO);
        assert_eq!(nanos("1n"), 1);
        assert_eq!(nanos("2u"), 2000);
        assert_eq!(nanos("3k"), 3000 * NANO);
        assert_eq!(nanos("1T"), 10i128.pow(12) * NANO);
        assert_eq!(nanos("1P"), 10i128.pow(15) * NANO);
        assert_eq!(nanos("1Ki"), 1024 * NANO);
        assert_eq!(nanos("1Ti"), (1i128 << 40) * NANO);
        assert_eq!(nanos("1Pi"), (1i128 << 50) * NANO);
        assert_eq!(nanos(".5"), NANO / 2);
        assert_eq!(nanos("+0.25k"), 250 * NANO);
        assert_eq!(nanos("007"), 7 * NANO);
        assert_eq!(nanos(" 2 "), 2 * NANO, "the JSON decoder trims spaces");
        assert_eq!(nanos("0"), 0);
        assert_eq!(nanos("-0"), 0);
        assert_eq!(nanos("-1"), -NANO);
        assert_eq!(nanos("-1.5Gi"), -1_610_612_736 * NANO);
    }

    /// Upstream's suffix table includes `E` (10^18) and `Ei` (2^60); 5Ei fits an int64
    /// and 9Ei does not, so it is capped at the largest int64 (`maxAllowed`).
    #[test]
    fn exa_suffixes_are_parsed_and_capped_at_the_largest_int64() {
        assert_eq!(
            parse_quantity("5Ei").unwrap().value(),
            5_764_607_523_034_234_880
        );
        assert_eq!(
            parse_quantity("1E").unwrap().value(),
            1_000_000_000_000_000_000
        );
        assert_eq!(parse_quantity("9Ei").unwrap(), Quantity::MAX);
        assert_eq!(parse_quantity("9Ei").unwrap().value(), i64::MAX);
        assert_eq!(parse_quantity("1e999999999").unwrap(), Quantity::MAX);
        assert_eq!(
            parse_quantity("-9Ei").unwrap().nanos(),
            -MAX_NANOS,
            "negative quantities are capped alike"
        );
        assert_eq!(
            parse_quantity("5e15").unwrap().milli_value(),
            5_000_000_000_000_000_000
        );
        assert_eq!(
            parse_quantity("1e16").unwrap().milli_value(),
            i64::MAX,
            "more millicores than an int64 holds saturate"
        );
    }

    /// Upstream rounds up to the nano (`inf.RoundUp`), so a request is never read as zero,
    /// and `Value()`/`MilliValue()` round up too.
    #[test]
    fn rounding_is_up_as_upstream() {
        assert_eq!(nanos("0.1n"), 1);
        assert_eq!(nanos("1e-30"), 1);
        assert_eq!(nanos("0.0000000001Ki"), 103, "102.4 nanos round up");
        assert_eq!(nanos("0.5Ki"), 512 * NANO);
        assert_eq!(parse_quantity("1m").unwrap().value(), 1);
        assert_eq!(parse_quantity("1001m").unwrap().value(), 2);
        assert_eq!(parse_quantity("1n").unwrap().milli_value(), 1);
        assert_eq!(parse_quantity("1.5").unwrap().milli_value(), 1500);
        // A long fraction with a huge negative exponent is still linear work.
        let long = format!("0.{}1e-1000000000", "0".repeat(10_000));
        assert_eq!(nanos(&long), 1);
    }

    /// Upstream `ErrFormatWrong` and `ErrSuffix`.
    #[test]
    fn malformed_quantities_are_refused() {
        for bad in [
            "", " ", "bogus", "1.2.3", "1 Gi", "--1", "1e", "1Zi", "1Ki2", "1kb",
        ] {
            let r = parse_quantity(bad);
            assert!(r.is_err(), "{bad:?} parsed as {r:?}");
        }
        assert_eq!(parse_quantity("1Zi"), Err(QuantityError::Format));
        assert_eq!(parse_quantity("1Ki2"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("1e"), Err(QuantityError::Suffix));
        assert_eq!(parse_quantity("bogus"), Err(QuantityError::Format));
    }
}
