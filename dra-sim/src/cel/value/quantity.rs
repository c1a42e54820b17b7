//! Kubernetes `resource.Quantity` semantics (parsing, canonical comparison, arithmetic) for the
//! CEL quantity library. The `cel` crate has no quantity type; this is our extension.
//!
//! A quantity is held exactly as `mantissa * 10^exp` (i128 mantissa, trailing zeros stripped), which
//! covers every value a slice or selector can spell (binary suffixes up to `Ei` are exact in decimal).
//! Parsing follows `resource.ParseQuantity`: sign, digits with at most one `.`, then one suffix
//! (`n u m "" k M G T P E`, `Ki Mi Gi Ti Pi Ei`, or `e<exp>`/`E<exp>`); precision finer than nano
//! is rounded up (away from zero) to nano.
//! Not `gpu_dra_api::quantity`: that yields whole numbers only, without formats or Go's errors.
use std::cmp::Ordering;
use std::fmt;

/// Kubernetes' quantity `Format`: how the canonical string is spelled. It follows the suffix the
/// quantity was parsed with and plays no part in comparisons or equality.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Format {
    #[default]
    DecimalSI,
    BinarySI,
    DecimalExponent,
}

#[derive(Clone, Copy, Debug)]
pub struct Quantity {
    mant: i128,
    exp: i32,
    fmt: Format,
    /// Made by the library's `add`/`sub`, which return a pointer to cel-go's `Quantity` where
    /// `quantity()` and the device return the value: its `Equal` takes only a value as the other
    /// side (see `value::equals`). Not part of the quantity's value.
    by_pointer: bool,
}

impl PartialEq for Quantity {
    fn eq(&self, o: &Self) -> bool {
        self.mant == o.mant && self.exp == o.exp
    }
}
impl Eq for Quantity {}
impl std::hash::Hash for Quantity {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.mant.hash(h);
        self.exp.hash(h);
    }
}

/// The error text `resource.ParseQuantity` gives for a malformed string.
pub const ERR_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const ERR_SUFFIX: &str = "unable to parse quantity's suffix";

impl Quantity {
    pub const ZERO: Quantity = Quantity {
        mant: 0,
        exp: 0,
        fmt: Format::DecimalSI,
        by_pointer: false,
    };

    fn new(mant: i128, exp: i32) -> Self {
        Quantity {
            mant,
            exp,
            fmt: Format::DecimalSI,
            by_pointer: false,
        }
    }

    /// This quantity as the library's arithmetic returns it (see `by_pointer`).
    pub fn by_pointer(self) -> Self {
        Quantity {
            by_pointer: true,
            ..self
        }
    }

    pub fn is_by_pointer(&self) -> bool {
        self.by_pointer
    }

    pub fn from_i64(v: i64) -> Self {
        Quantity::new(i128::from(v), 0).norm()
    }

    pub fn format(&self) -> Format {
        self.fmt
    }

    pub fn with_format(mut self, fmt: Format) -> Self {
        self.fmt = fmt;
        self
    }

    fn norm(mut self) -> Self {
        if self.mant == 0 {
            self.exp = 0;
            return self;
        }
        while self.mant % 10 == 0 {
            self.mant /= 10;
            self.exp += 1;
        }
        self
    }

    pub fn parse(s: &str) -> Result<Quantity, String> {
        if s.is_empty() {
            return Err(ERR_FORMAT.to_string());
        }
        let b = s.as_bytes();
        let mut i = 0;
        let mut neg = false;
        if b[0] == b'+' || b[0] == b'-' {
            neg = b[0] == b'-';
            i = 1;
        }
        let num_start = i;
        let mut seen_dot = false;
        let mut digits = String::new();
        let mut frac_len: i32 = 0;
        while i < b.len() {
            let c = b[i];
            if c.is_ascii_digit() {
                digits.push(c as char);
                if seen_dot {
                    frac_len += 1;
                }
            } else if c == b'.' && !seen_dot {
                seen_dot = true;
            } else {
                break;
            }
            i += 1;
        }
        if i == num_start || digits.is_empty() {
            return Err(ERR_FORMAT.to_string());
        }
        let suffix = &s[i..];
        let (base, exp10) = suffix_scale(suffix)?;
        let digits = digits.trim_start_matches('0');
        let mut mant: i128 = 0;
        let mut exp: i32 = -frac_len;
        for (n, c) in digits.bytes().enumerate() {
            if n >= 36 {
                // too many significant digits for i128: drop the rest (rounding up below nano)
                exp = exp.saturating_add(i32::try_from(digits.len() - n).unwrap_or(i32::MAX));
                break;
            }
            mant = mant * 10 + i128::from(c - b'0');
        }
        if neg {
            mant = -mant;
        }
        let mut q = Quantity::new(mant, exp).norm();
        q.fmt = if base == 2 {
            Format::BinarySI
        } else if suffix.starts_with(['e', 'E']) {
            Format::DecimalExponent
        } else {
            Format::DecimalSI
        };
        if base == 10 {
            q.exp = q.exp.saturating_add(exp10);
        } else {
            let factor: i128 = 1i128 << exp10;
            q.mant = q
                .mant
                .checked_mul(factor)
                .ok_or_else(|| "quantity too large".to_string())?;
            q = q.norm();
        }
        Ok(q.round_nano())
    }

    /// Rounds up (away from zero) to nano precision, as Kubernetes does on parse.
    fn round_nano(self) -> Self {
        if self.exp >= -9 {
            return self;
        }
        let shift = (-9 - self.exp).unsigned_abs();
        if shift > 38 {
            return Quantity::new(self.mant.signum(), -9)
                .norm()
                .with_format(self.fmt);
        }
        let p = 10i128.pow(shift);
        let mut m = self.mant / p;
        if self.mant % p != 0 {
            m += self.mant.signum();
        }
        Quantity::new(m, -9).norm().with_format(self.fmt)
    }

    fn aligned(a: Quantity, b: Quantity) -> Option<(i128, i128)> {
        let e = a.exp.min(b.exp);
        let sa = pow10(a.exp - e).and_then(|p| a.mant.checked_mul(p))?;
        let sb = pow10(b.exp - e).and_then(|p| b.mant.checked_mul(p))?;
        Some((sa, sb))
    }

    pub fn sign(&self) -> i64 {
        i64::from(self.mant > 0) - i64::from(self.mant < 0)
    }

    pub fn cmp_q(&self, o: &Quantity) -> Ordering {
        if self.mant.signum() != o.mant.signum() {
            return self.mant.signum().cmp(&o.mant.signum());
        }
        match Quantity::aligned(*self, *o) {
            Some((a, b)) => a.cmp(&b),
            None => {
                // magnitudes differ by many orders: compare by decimal length
                let la = i64::from(digits_len(self.mant)) + i64::from(self.exp);
                let lb = i64::from(digits_len(o.mant)) + i64::from(o.exp);
                let c = la.cmp(&lb);
                if self.mant < 0 { c.reverse() } else { c }
            }
        }
    }

    pub fn add(&self, o: &Quantity) -> Result<Quantity, String> {
        let (a, b) = Quantity::aligned(*self, *o).ok_or("quantity overflow")?;
        let m = a.checked_add(b).ok_or("quantity overflow")?;
        // like `Quantity.Add`: a zero receiver takes the other operand's format
        let fmt = if self.mant == 0 { o.fmt } else { self.fmt };
        Ok(Quantity::new(m, self.exp.min(o.exp))
            .norm()
            .with_format(fmt))
    }

    pub fn sub(&self, o: &Quantity) -> Result<Quantity, String> {
        self.add(&Quantity {
            mant: -o.mant,
            ..*o
        })
    }

    /// `AsInt64`: the value when it is an integer within int64.
    pub fn as_i64(&self) -> Option<i64> {
        if self.exp < 0 {
            return None;
        }
        let p = pow10(self.exp)?;
        let v = self.mant.checked_mul(p)?;
        i64::try_from(v).ok()
    }

    pub fn as_f64(&self) -> f64 {
        (self.mant as f64) * 10f64.powi(self.exp)
    }

    /// Milli-value (rounded up like `MilliValue`), for the consumable-capacity step arithmetic.
    pub fn milli(&self) -> i128 {
        let e = self.exp + 3;
        if e >= 0 {
            pow10(e)
                .and_then(|p| self.mant.checked_mul(p))
                .unwrap_or(i128::MAX)
        } else {
            let p = pow10(-e).unwrap_or(i128::MAX);
            let mut m = self.mant / p;
            if self.mant % p != 0 {
                m += self.mant.signum();
            }
            m
        }
    }

    pub fn from_milli(m: i128) -> Quantity {
        Quantity::new(m, -3).norm()
    }

    /// Integer value rounded up (`Value()`).
    pub fn value_ceil(&self) -> i128 {
        if self.exp >= 0 {
            return pow10(self.exp)
                .and_then(|p| self.mant.checked_mul(p))
                .unwrap_or(i128::MAX);
        }
        let p = pow10(-self.exp).unwrap_or(i128::MAX);
        let mut m = self.mant / p;
        if self.mant % p != 0 && self.mant > 0 {
            m += 1;
        }
        m
    }
}

fn suffix_err(_s: &str) -> String {
    ERR_SUFFIX.to_string()
}

fn digits_len(m: i128) -> u32 {
    let mut m = m.unsigned_abs();
    let mut n = 0;
    while m > 0 {
        m /= 10;
        n += 1;
    }
    n
}

fn pow10(e: i32) -> Option<i128> {
    let e = u32::try_from(e).ok().filter(|e| *e <= 38)?;
    10i128.checked_pow(e)
}

impl fmt::Display for Quantity {
    /// A plain decimal rendering (not the Kubernetes canonical suffix form).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exp >= 0 {
            write!(f, "{}", self.mant)?;
            for _ in 0..self.exp.min(40) {
                f.write_str("0")?;
            }
            Ok(())
        } else {
            let neg = self.mant < 0;
            let s = self.mant.unsigned_abs().to_string();
            let fl = self.exp.unsigned_abs() as usize;
            let (ip, fp) = if s.len() > fl {
                (s[..s.len() - fl].to_string(), s[s.len() - fl..].to_string())
            } else {
                (
                    "0".to_string(),
                    format!("{}{}", "0".repeat(fl - s.len()), s),
                )
            };
            write!(f, "{}{}.{}", if neg { "-" } else { "" }, ip, fp)
        }
    }
}

impl Quantity {
    /// Kubernetes' canonical string (`Quantity.String()` / `CanonicalizeBytes`) in this
    /// quantity's format: `BinarySI` as the largest exact power of 1024 (falling back to decimal SI
    /// below 1024 or for fractions); decimal formats with an exponent that is a multiple of 3 and
    /// the SI suffix, or `e<exp>` for the exponent format and for exponents without a suffix.
    pub fn canonical(&self) -> String {
        if self.mant == 0 {
            return "0".to_string();
        }
        let mut fmt = self.fmt;
        if fmt == Format::BinarySI {
            let small = self.cmp_q(&Quantity::from_i64(-1024)) == Ordering::Greater
                && self.cmp_q(&Quantity::from_i64(1024)) == Ordering::Less;
            if small || self.exp < 0 {
                fmt = Format::DecimalSI;
            } else if let Some(mut v) = pow10(self.exp).and_then(|p| self.mant.checked_mul(p)) {
                let mut e = 0;
                while v % 1024 == 0 {
                    v /= 1024;
                    e += 1;
                }
                let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
                    .get(e)
                    .copied()
                    .unwrap_or("");
                return format!("{v}{suffix}");
            } else {
                fmt = Format::DecimalSI;
            }
        }
        // trailing zeros are already stripped; lower the exponent to a multiple of 3
        let mut m = self.mant;
        let mut e = self.exp;
        while e % 3 != 0 {
            m *= 10;
            e -= 1;
        }
        let si = match e {
            -9 => Some("n"),
            -6 => Some("u"),
            -3 => Some("m"),
            0 => Some(""),
            3 => Some("k"),
            6 => Some("M"),
            9 => Some("G"),
            12 => Some("T"),
            15 => Some("P"),
            18 => Some("E"),
            _ => None,
        };
        match (fmt, si) {
            (_, _) if e == 0 => format!("{m}"),
            (Format::DecimalSI, Some(sfx)) => format!("{m}{sfx}"),
            _ => format!("{m}e{e}"),
        }
    }
}

/// A suffix's base and exponent (`Ki`: 2^10, `M`: 10^6, `e3`: 10^3), validated like the Go parser:
/// letters, or `e`/`E` and optionally signed digits.
fn suffix_scale(suffix: &str) -> Result<(u32, i32), String> {
    Ok(match suffix {
        "" => (10, 0),
        "n" => (10, -9),
        "u" => (10, -6),
        "m" => (10, -3),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        _ => {
            let sb = suffix.as_bytes();
            if (sb[0] == b'e' || sb[0] == b'E') && sb.len() > 1 {
                let rest = &suffix[1..];
                let ok = rest
                    .strip_prefix(['+', '-'])
                    .unwrap_or(rest)
                    .bytes()
                    .all(|c| c.is_ascii_digit())
                    && !rest.strip_prefix(['+', '-']).unwrap_or(rest).is_empty();
                if !ok {
                    return Err(suffix_err(suffix));
                }
                let e: i32 = rest.parse().map_err(|_| ERR_SUFFIX.to_string())?;
                (10, e)
            } else {
                return Err(suffix_err(suffix));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }
    #[test]
    fn parse_and_compare() {
        assert_eq!(q("1Ki").cmp_q(&q("1024")), Ordering::Equal);
        assert_eq!(q("1k").cmp_q(&q("1Ki")), Ordering::Less);
        assert_eq!(q("40Gi").cmp_q(&q("42949672960")), Ordering::Equal);
        assert_eq!(q("0.5").cmp_q(&q("500m")), Ordering::Equal);
        assert_eq!(q("1e3").cmp_q(&q("1k")), Ordering::Equal);
        assert_eq!(q("-1").cmp_q(&q("1n")), Ordering::Less);
        assert_eq!(q("1.5Gi").as_i64(), Some(1610612736));
        assert_eq!(q("0.1n"), q("1n"));
        assert_eq!(q("-0.1n"), q("-1n"));
        assert_eq!(q("+3").as_i64(), Some(3));
        assert_eq!(q(".5").milli(), 500);
        for bad in ["", "abc", "1.2.3", "1Zi", "1e", "--1", "1 Gi", "Ki"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }
    #[test]
    fn arithmetic() {
        assert_eq!(q("1Gi").sub(&q("512Mi")).unwrap(), q("512Mi"));
        assert_eq!(q("1.5").add(&q("500m")).unwrap(), q("2"));
        assert_eq!(q("1.5").as_i64(), None);
        assert_eq!(q("2k").canonical(), "2k");
        assert_eq!(q("1500m").canonical(), "1500m");
        assert_eq!(q("10Gi").canonical(), "10Gi");
        assert_eq!(q("1.5Gi").canonical(), "1536Mi");
        assert_eq!(q("1Ki").add(&q("1")).unwrap().canonical(), "1025");
        assert_eq!(q("512").with_format(Format::BinarySI).canonical(), "512");
        assert_eq!(q("0.5Ki").canonical(), "512");
        assert_eq!(q("1e3").canonical(), "1e3");
        assert_eq!(q("1500e0").canonical(), "1500");
        assert_eq!(q("12e4").canonical(), "120e3");
        assert_eq!(q("1e21").canonical(), "1e21");
        assert_eq!(q("42949672960").canonical(), "42949672960");
        assert_eq!(q("0").add(&q("1Ki")).unwrap().canonical(), "1Ki");
    }
}
