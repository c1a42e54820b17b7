//! Just enough of Kubernetes quantities for the driver: memory sizes in and out.
use crate::{Error, Result};

/// Parses a Kubernetes quantity (`40Gi`, `512M`, `1e3`, `1024`) into a whole number, rounding up.
pub fn parse_int(s: &str) -> Result<u128> {
    let bad = || Error::Quantity(s.to_string());
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() || num.starts_with('-') {
        return Err(bad());
    }
    let num = num.trim_start_matches('+');
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(bad());
    }
    let (mult, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..].parse().map_err(|_| bad())?;
            (10u128.checked_pow(exp).ok_or_else(bad)?, 1)
        }
        _ => return Err(bad()),
    };
    let digits = |d: &str| -> Result<u128> {
        if d.is_empty() {
            Ok(0)
        } else if d.bytes().all(|b| b.is_ascii_digit()) {
            d.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let scale = 10u128.checked_pow(frac_part.len() as u32).ok_or_else(bad)?;
    let numerator = (digits(int_part)? * scale + digits(frac_part)?)
        .checked_mul(mult)
        .ok_or_else(bad)?;
    let denominator = scale * div;
    Ok(numerator.div_ceil(denominator))
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
        for bad in ["", "Gi", "-1", "1.2.3", "10XB", "1e"] {
            assert!(parse_int(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_in_the_largest_exact_binary_unit() {
        assert_eq!(format_bytes(81559 << 20), "81559Mi");
        assert_eq!(format_bytes(80 << 30), "80Gi");
        assert_eq!(format_bytes(1000), "1000");
    }
}
