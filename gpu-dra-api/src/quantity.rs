//! Just enough of Kubernetes quantities for the driver: memory sizes in and out.
//! Not shared with dra-sim's CEL quantity type: that needs exact decimals, formats and Go's errors.
use crate::{Error, Result};

/// Parses a Kubernetes quantity (`40Gi`, `512M`, `1e3`, `1024`) into a whole number of bytes,
/// rounding up. Stricter than [`value`]: surrounding whitespace is ignored, but the number must
/// start with a digit (or `.digit`) and must not be negative.
pub fn parse_int(s: &str) -> Result<u128> {
    let t = s.trim();
    let unsigned = t.strip_prefix('+').unwrap_or(t);
    let starts_with_digit = unsigned.starts_with(|c: char| c.is_ascii_digit())
        || unsigned
            .strip_prefix('.')
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    if !starts_with_digit {
        return Err(Error::Quantity(s.to_string()));
    }
    let v = value(unsigned).map_err(|_| Error::Quantity(s.to_string()))?;
    Ok(u128::try_from(v).unwrap_or(0))
}

/// The value of a quantity exactly as Kubernetes' `resource.ParseQuantity` accepts it, rounded up
/// to a whole number the way `Quantity.Value()` rounds (towards positive infinity).
///
/// The grammar is Kubernetes', quirks included: an optional sign, digits with at most one `.`, then
/// a suffix (`n u m k M G T P E`, `Ki Mi Gi Ti Pi Ei`, or `e`/`E` and a signed integer). Digits may
/// be missing altogether (`.`, `+`, `Gi` all read as zero); only the empty string is refused for
/// having no number. No whitespace is allowed. Values beyond `i128` saturate.
pub fn value(s: &str) -> Result<i128> {
    let bad = || Error::Quantity(s.to_string());
    if s.is_empty() {
        return Err(bad());
    }
    let b = s.as_bytes();
    let mut pos = 0;
    let negative = match b[0] {
        b'-' => {
            pos = 1;
            true
        }
        b'+' => {
            pos = 1;
            false
        }
        _ => false,
    };
    let digits_from = |mut p: usize| {
        while p < b.len() && b[p].is_ascii_digit() {
            p += 1;
        }
        p
    };
    let int_end = digits_from(pos);
    let int_digits = &s[pos..int_end];
    pos = int_end;
    let mut frac_digits = "";
    if pos < b.len() && b[pos] == b'.' {
        let frac_end = digits_from(pos + 1);
        frac_digits = &s[pos + 1..frac_end];
        pos = frac_end;
    }
    let suffix = &s[pos..];
    // The suffix's shape: letters of `eEinumkKMGTP`, an optional sign, digits, and nothing else.
    let rest = suffix.trim_start_matches(|c: char| "eEinumkKMGTP".contains(c));
    let rest = rest.strip_prefix(['+', '-']).unwrap_or(rest);
    if !rest.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    enum Scale {
        Decimal(i64),
        Binary(u32),
    }
    let scale = match suffix {
        "" => Scale::Decimal(0),
        "n" => Scale::Decimal(-9),
        "u" => Scale::Decimal(-6),
        "m" => Scale::Decimal(-3),
        "k" => Scale::Decimal(3),
        "M" => Scale::Decimal(6),
        "G" => Scale::Decimal(9),
        "T" => Scale::Decimal(12),
        "P" => Scale::Decimal(15),
        "E" => Scale::Decimal(18),
        "Ki" => Scale::Binary(10),
        "Mi" => Scale::Binary(20),
        "Gi" => Scale::Binary(30),
        "Ti" => Scale::Binary(40),
        "Pi" => Scale::Binary(50),
        "Ei" => Scale::Binary(60),
        e if e.len() > 1 && e.starts_with(['e', 'E']) => {
            let exponent: i64 = e[1..].parse().map_err(|_| bad())?;
            // Kubernetes parses the exponent as int64 and keeps its low 32 bits.
            #[allow(clippy::cast_possible_truncation)]
            let low_bits = exponent as i32;
            Scale::Decimal(i64::from(low_bits))
        }
        _ => return Err(bad()),
    };
    // magnitude = mantissa * multiplier / 10^fraction digits (with the exponent folded in)
    let mantissa_digits = format!("{int_digits}{frac_digits}");
    let mantissa_digits = mantissa_digits.trim_start_matches('0');
    let mantissa: Option<u128> = if mantissa_digits.is_empty() {
        Some(0)
    } else {
        mantissa_digits.parse().ok()
    };
    let frac = i64::try_from(frac_digits.len()).unwrap_or(i64::MAX);
    let pow10 = |e: i64| u32::try_from(e).ok().and_then(|e| 10u128.checked_pow(e));
    let (numerator, denominator): (Option<u128>, Option<u128>) = match scale {
        Scale::Decimal(e) => {
            let e = e - frac;
            if e >= 0 {
                (mantissa.and_then(|m| m.checked_mul(pow10(e)?)), Some(1))
            } else {
                (mantissa, pow10(-e))
            }
        }
        Scale::Binary(k) => (
            mantissa.and_then(|m| m.checked_mul(1u128 << k)),
            pow10(frac),
        ),
    };
    let magnitude_floor_ceil = match (numerator, denominator) {
        (Some(0), _) if mantissa == Some(0) => (0, 0),
        (Some(n), Some(d)) => (n / d, n.div_ceil(d)),
        // Below any representable denominator: a tiny non-zero number.
        (Some(_), None) => (0, 1),
        // Beyond u128: saturate.
        (None, _) => (u128::MAX, u128::MAX),
    };
    let clamp = |v: u128| i128::try_from(v).unwrap_or(i128::MAX);
    Ok(if negative {
        -clamp(magnitude_floor_ceil.0)
    } else {
        clamp(magnitude_floor_ceil.1)
    })
}

/// Formats a byte count the way Kubernetes would canonicalise it for binary sizes.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    for (unit, shift) in UNITS {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_exponent_forms() {
        assert_eq!(parse_int("40Gi").unwrap(), 40 << 30);
        assert_eq!(parse_int("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_int("512M").unwrap(), 512_000_000);
        assert_eq!(parse_int("1e3").unwrap(), 1000);
        assert_eq!(parse_int("1024").unwrap(), 1024);
        assert_eq!(parse_int("1500m").unwrap(), 2);
        for bad in ["", "Gi", "-1", "1.2.3", "10XB", "1e", "e3"] {
            assert!(parse_int(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_int(" 2Mi ").unwrap(), 2 << 20);
    }

    #[test]
    fn value_reads_what_kubernetes_parse_quantity_reads() {
        let ok = [
            ("1Gi", 1 << 30),
            ("+1Mi", 1 << 20),
            ("-1Mi", -(1 << 20)),
            ("1.5Mi", 3 << 19),
            ("1.Gi", 1 << 30),
            (".5Ki", 512),
            ("1048575.5", 1_048_576),
            ("-1.5", -1),
            ("1E3", 1000),
            ("1e+3", 1000),
            ("15e-1", 2),
            ("1E", 1_000_000_000_000_000_000),
            ("1u", 1),
            ("1n", 1),
            ("0", 0),
            // Kubernetes reads these as zero.
            (".", 0),
            ("+", 0),
            ("-", 0),
            ("Gi", 0),
            (".Gi", 0),
            ("1e-50", 1),
        ];
        for (s, want) in ok {
            assert_eq!(value(s).unwrap(), want, "{s}");
        }
        assert_eq!(value("1e40").unwrap(), i128::MAX);
        for bad in [
            "", " 1", "1 ", "1Gb", "1e", "e", "1.2.3", "1K", "1Mi5", "1Ki+", "1e1.5", "0x10", "1i",
        ] {
            assert!(value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats_in_the_largest_exact_binary_unit() {
        assert_eq!(format_bytes(81559 << 20), "81559Mi");
        assert_eq!(format_bytes(80 << 30), "80Gi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
