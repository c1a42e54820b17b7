//! Semantic versions with the rules of `github.com/blang/semver/v4` (strict `Parse`, `Compare`)
//! and the apiserver semver library's `normalize` mode. The `cel` crate has no semver type; this
//! is our extension.
use std::cmp::Ordering;
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pre {
    Num(u64),
    Alpha(String),
}

#[derive(Clone, Debug)]
pub struct Semver {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: Vec<Pre>,
    pub build: Vec<String>,
}

fn only(s: &str, f: impl Fn(u8) -> bool) -> bool {
    !s.is_empty() && s.bytes().all(f)
}

fn num(s: &str, what: &str) -> Result<u64, String> {
    if !only(s, |c| c.is_ascii_digit()) {
        return Err(format!("Invalid character(s) found in {what} number {s:?}"));
    }
    if s.len() > 1 && s.starts_with('0') {
        return Err(format!(
            "{what} number must not contain leading zeroes {s:?}"
        ));
    }
    s.parse::<u64>().map_err(|e| e.to_string())
}

/// Whether `s` is a plain `MAJOR.MINOR.PATCH` that [`Semver::parse`] accepts (no prerelease or
/// build, no leading zeros, each part a u64). Lets a device check skip building the value for
/// the common case; anything else goes through `parse` and its error.
pub fn is_plain(s: &str) -> bool {
    let mut parts = 0;
    for p in s.split('.') {
        parts += 1;
        let ok = parts <= 3
            && !p.is_empty()
            && (p.len() == 1 || !p.starts_with('0'))
            && only(p, |c| c.is_ascii_digit())
            && p.parse::<u64>().is_ok();
        if !ok {
            return false;
        }
    }
    parts == 3
}

impl Semver {
    pub fn parse(s: &str) -> Result<Semver, String> {
        if s.is_empty() {
            return Err("Version string empty".into());
        }
        let parts: Vec<&str> = s.splitn(3, '.').collect();
        if parts.len() != 3 {
            return Err("No Major.Minor.Patch elements found".into());
        }
        let major = num(parts[0], "Major")?;
        let minor = num(parts[1], "Minor")?;
        let mut patch_str = parts[2];
        let mut build = Vec::new();
        let mut pre = Vec::new();
        if let Some(i) = patch_str.find('+') {
            for b in patch_str[i + 1..].split('.') {
                if b.is_empty() {
                    return Err("Build meta data is empty".into());
                }
                if !only(b, |c| c.is_ascii_alphanumeric() || c == b'-') {
                    return Err(format!(
                        "Invalid character(s) found in build meta data {b:?}"
                    ));
                }
                build.push(b.to_string());
            }
            patch_str = &patch_str[..i];
        }
        if let Some(i) = patch_str.find('-') {
            for p in patch_str[i + 1..].split('.') {
                if p.is_empty() {
                    return Err("Prerelease is empty".into());
                }
                if only(p, |c| c.is_ascii_digit()) {
                    if p.len() > 1 && p.starts_with('0') {
                        return Err(format!("Leading zeroes in prerelease {p:?}"));
                    }
                    pre.push(Pre::Num(
                        p.parse()
                            .map_err(|e: std::num::ParseIntError| e.to_string())?,
                    ));
                } else if only(p, |c| c.is_ascii_alphanumeric() || c == b'-') {
                    pre.push(Pre::Alpha(p.to_string()));
                } else {
                    return Err(format!("Invalid character(s) found in prerelease {p:?}"));
                }
            }
            patch_str = &patch_str[..i];
        }
        let patch = num(patch_str, "Patch")?;
        Ok(Semver {
            major,
            minor,
            patch,
            pre,
            build,
        })
    }

    /// The library's `normalizeAndParse`: drop a leading `v`, strip leading zeros, fill missing
    /// minor/patch with 0.
    pub fn parse_normalized(s: &str) -> Result<Semver, String> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s.splitn(3, '.').map(|p| p.to_string()).collect();
        for p in parts.iter_mut() {
            if p.len() > 1 {
                let mut t = p.trim_start_matches('0').to_string();
                if t.is_empty() || !t.as_bytes()[0].is_ascii_digit() {
                    t = format!("0{t}");
                }
                *p = t;
            }
        }
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return Err("short version cannot contain PreRelease/Build meta data".into());
            }
            while parts.len() < 3 {
                parts.push("0".into());
            }
        }
        Semver::parse(&parts.join("."))
    }

    pub fn compare(&self, o: &Semver) -> Ordering {
        let c = (self.major, self.minor, self.patch).cmp(&(o.major, o.minor, o.patch));
        if c != Ordering::Equal {
            return c;
        }
        match (self.pre.is_empty(), o.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            _ => {}
        }
        for (a, b) in self.pre.iter().zip(o.pre.iter()) {
            let c = match (a, b) {
                (Pre::Num(x), Pre::Num(y)) => x.cmp(y),
                (Pre::Num(_), Pre::Alpha(_)) => Ordering::Less,
                (Pre::Alpha(_), Pre::Num(_)) => Ordering::Greater,
                (Pre::Alpha(x), Pre::Alpha(y)) => x.cmp(y),
            };
            if c != Ordering::Equal {
                return c;
            }
        }
        self.pre.len().cmp(&o.pre.len())
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, p) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match p {
                Pre::Num(n) => write!(f, "{n}")?,
                Pre::Alpha(s) => f.write_str(s)?,
            }
        }
        for (i, b) in self.build.iter().enumerate() {
            f.write_str(if i == 0 { "+" } else { "." })?;
            f.write_str(b)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn strict_and_normalized() {
        assert!(Semver::parse("1.2.3-rc.1+b.5").is_ok());
        for bad in [
            "", "1.2", "v1.2.3", "01.2.3", "1.2.3-01", "1.2.3-", "1.2.3+", "1.2.x",
        ] {
            assert!(Semver::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Semver::parse_normalized("v01.2").unwrap().to_string(),
            "1.2.0"
        );
        assert!(Semver::parse_normalized("1.2-rc").is_err());
        let a = Semver::parse("1.0.0-alpha").unwrap();
        let b = Semver::parse("1.0.0-alpha.1").unwrap();
        let c = Semver::parse("1.0.0").unwrap();
        assert_eq!(a.compare(&b), Ordering::Less);
        assert_eq!(b.compare(&c), Ordering::Less);
        assert_eq!(
            Semver::parse("1.0.0+x").unwrap().compare(&c),
            Ordering::Equal
        );
    }

    #[test]
    fn plain_versions_are_exactly_those_parse_takes_without_extras() {
        for plain in ["0.0.0", "9.0.0", "580.105.8", "18446744073709551615.1.2"] {
            assert!(is_plain(plain), "{plain}");
            let v = Semver::parse(plain).unwrap();
            assert!(v.pre.is_empty() && v.build.is_empty());
        }
        for other in [
            "",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.02.3",
            "1.2.03",
            "1..3",
            "1.2.",
            "v1.2.3",
            "1.2.3-rc",
            "1.2.3+b",
            "1.2.x",
            "18446744073709551616.0.0",
            "1.2.3 ",
        ] {
            assert!(!is_plain(other), "{other}");
        }
        // what is not plain is left to parse, which accepts some and rejects the rest
        assert!(Semver::parse("1.2.3-rc").is_ok());
        assert!(Semver::parse("1.02.3").is_err());
    }
}
