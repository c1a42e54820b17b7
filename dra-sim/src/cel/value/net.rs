//! IP addresses and CIDR prefixes for the apiserver's `ip`/`cidr` CEL libraries. Parsing follows
//! Go's `net/netip` (`ParseAddr`, `ParsePrefix`) because that is what decides validity upstream,
//! plus the library's own refusals (zones, IPv4-mapped IPv6). Formatting follows `Addr.String`
//! (RFC 5952), since `ip.isCanonical` compares against it.
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    pub addr: Addr,
    pub bits: u8,
}

/// A `ParseAddr` error in Go's wording: `ParseAddr("in"): msg (at "rest")`.
fn addr_err(input: &str, msg: &str, at: Option<&str>) -> String {
    match at {
        Some(at) if !at.is_empty() => format!("ParseAddr({input:?}): {msg} (at {at:?})"),
        _ => format!("ParseAddr({input:?}): {msg}"),
    }
}

/// `netip.ParseAddr`: the first `.`, `:` or `%` picks the family. The flag says whether an IPv6
/// zone followed (the address is returned without it).
pub(crate) fn parse_netip(s: &str) -> Result<(Addr, bool), String> {
    for c in s.bytes() {
        match c {
            b'.' => return parse_v4(s, s).map(|a| (Addr::V4(a), false)),
            b':' => {
                return match s.split_once('%') {
                    Some((_, "")) => Err(addr_err(s, "zone must be a non-empty string", None)),
                    Some((a, _)) => parse_v6(s, a).map(|a| (a, true)),
                    None => parse_v6(s, s).map(|a| (a, false)),
                };
            }
            b'%' => return Err(addr_err(s, "missing IPv6 address", None)),
            _ => {}
        }
    }
    Err(addr_err(s, "unable to parse IP", None))
}

/// Four decimal octets without leading zeros; `input` is the whole string, for errors.
fn parse_v4(input: &str, s: &str) -> Result<[u8; 4], String> {
    let b = s.as_bytes();
    let mut out = [0u8; 4];
    let (mut val, mut pos, mut digits) = (0u8, 0usize, 0usize);
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                if digits == 1 && val == 0 {
                    return Err(addr_err(
                        input,
                        "IPv4 field has octet with leading zero",
                        None,
                    ));
                }
                let Ok(v) = u8::try_from(u32::from(val) * 10 + u32::from(c - b'0')) else {
                    return Err(addr_err(input, "IPv4 field has value >255", None));
                };
                val = v;
                digits += 1;
            }
            b'.' => {
                if i == 0 || i == b.len() - 1 || b[i - 1] == b'.' {
                    return Err(addr_err(
                        input,
                        "IPv4 field must have at least one digit",
                        Some(&s[i..]),
                    ));
                }
                if pos == 3 {
                    return Err(addr_err(input, "IPv4 address too long", None));
                }
                out[pos] = val;
                pos += 1;
                val = 0;
                digits = 0;
            }
            _ => return Err(addr_err(input, "unexpected character", Some(&s[i..]))),
        }
    }
    if pos < 3 {
        return Err(addr_err(input, "IPv4 address too short", None));
    }
    out[3] = val;
    Ok(out)
}

/// Up to eight hex groups, one `::`, an optional dotted IPv4 tail; `s` is `input` without its
/// zone.
fn parse_v6(input: &str, s: &str) -> Result<Addr, String> {
    let mut s = s;
    let mut ip = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    if s.starts_with("::") {
        ellipsis = Some(0);
        s = &s[2..];
        if s.is_empty() {
            return Ok(Addr::V6(ip));
        }
    }
    let mut i = 0;
    while i < 16 {
        let (acc, off) = hex_group(input, s)?;
        if s.as_bytes().get(off) == Some(&b'.') {
            if ellipsis.is_none() && i != 12 {
                return Err(addr_err(
                    input,
                    "embedded IPv4 address must replace the final 2 fields of the address",
                    Some(s),
                ));
            }
            if i + 4 > 16 {
                return Err(addr_err(
                    input,
                    "too many hex fields to fit an embedded IPv4 at the end of the address",
                    Some(s),
                ));
            }
            ip[i..i + 4].copy_from_slice(&parse_v4(input, s)?);
            s = "";
            i += 4;
            break;
        }
        ip[i..i + 2].copy_from_slice(&acc.to_be_bytes());
        i += 2;
        s = &s[off..];
        if s.is_empty() {
            break;
        }
        if !s.starts_with(':') {
            return Err(addr_err(input, "unexpected character, want colon", Some(s)));
        }
        if s.len() == 1 {
            return Err(addr_err(
                input,
                "colon must be followed by more characters",
                Some(s),
            ));
        }
        s = &s[1..];
        if s.starts_with(':') {
            if ellipsis.is_some() {
                return Err(addr_err(input, "multiple :: in address", Some(s)));
            }
            ellipsis = Some(i);
            s = &s[1..];
            if s.is_empty() {
                break;
            }
        }
    }
    if !s.is_empty() {
        return Err(addr_err(input, "trailing garbage after address", Some(s)));
    }
    expand_ellipsis(input, &mut ip, i, ellipsis)?;
    Ok(Addr::V6(ip))
}

/// One hex group at the start of `s`: its value and how many digits it took.
fn hex_group(input: &str, s: &str) -> Result<(u16, usize), String> {
    let b = s.as_bytes();
    let mut off = 0;
    let mut acc = 0u16;
    while off < b.len() {
        let Some(d) = char::from(b[off])
            .to_digit(16)
            .and_then(|d| u16::try_from(d).ok())
        else {
            break;
        };
        if off > 3 {
            return Err(addr_err(
                input,
                "each group must have 4 or less digits",
                Some(s),
            ));
        }
        // at most four digits (checked just above), so nothing is shifted out
        acc = (acc << 4) | d;
        off += 1;
    }
    if off == 0 {
        return Err(addr_err(
            input,
            "each colon-separated field must have at least one digit",
            Some(s),
        ));
    }
    Ok((acc, off))
}

/// Fills the `::` (at byte `ellipsis`) of an address whose groups end at byte `end`.
fn expand_ellipsis(
    input: &str,
    ip: &mut [u8; 16],
    end: usize,
    ellipsis: Option<usize>,
) -> Result<(), String> {
    if end < 16 {
        let Some(e) = ellipsis else {
            return Err(addr_err(input, "address string too short", None));
        };
        // slide the groups after `::` to the end and zero the gap
        let n = 16 - end;
        ip.copy_within(e..end, e + n);
        ip[e..e + n].fill(0);
    } else if ellipsis.is_some() {
        return Err(addr_err(
            input,
            "the :: must expand to at least one field of zeros",
            None,
        ));
    }
    Ok(())
}

impl Addr {
    /// `ip(s)`: `netip.ParseAddr` plus the library's refusal of zones and IPv4-mapped IPv6.
    pub fn parse(s: &str) -> Result<Addr, String> {
        let (a, zoned) = parse_netip(s).map_err(|e| {
            format!("IP Address {s:?} parse error during conversion from string: {e}")
        })?;
        if zoned {
            return Err(format!("IP address {s:?} with zone value is not allowed"));
        }
        if a.is_4in6() {
            return Err(format!("IPv4-mapped IPv6 address {s:?} is not allowed"));
        }
        Ok(a)
    }

    pub(crate) fn is_4in6(&self) -> bool {
        matches!(self, Addr::V6(b) if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff)
    }

    pub fn family(&self) -> i64 {
        match self {
            Addr::V4(_) => 4,
            Addr::V6(_) => 6,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Addr::V4(b) => b,
            Addr::V6(b) => b,
        }
    }

    /// Bytes, as cel's `Size()` of an IP counts them (the cost of comparisons).
    pub fn byte_len(&self) -> u64 {
        self.bytes().len() as u64
    }

    fn first_u16(&self) -> u16 {
        let b = self.bytes();
        u16::from_be_bytes([b[0], b[1]])
    }

    pub fn is_unspecified(&self) -> bool {
        self.bytes().iter().all(|&x| x == 0)
    }

    pub fn is_loopback(&self) -> bool {
        match self {
            Addr::V4(b) => b[0] == 127,
            Addr::V6(b) => b[..15].iter().all(|&x| x == 0) && b[15] == 1,
        }
    }

    fn is_multicast(&self) -> bool {
        match self {
            Addr::V4(b) => b[0] & 0xf0 == 0xe0,
            Addr::V6(b) => b[0] == 0xff,
        }
    }

    pub fn is_link_local_multicast(&self) -> bool {
        match self {
            Addr::V4(b) => b[0] == 224 && b[1] == 0 && b[2] == 0,
            // any scope flags, link-local scope (ffx2::/16)
            Addr::V6(_) => self.first_u16() & 0xff0f == 0xff02,
        }
    }

    pub fn is_link_local_unicast(&self) -> bool {
        match self {
            Addr::V4(b) => b[0] == 169 && b[1] == 254,
            Addr::V6(_) => self.first_u16() & 0xffc0 == 0xfe80,
        }
    }

    /// Go's definition: private and ULA ranges count as global too.
    pub fn is_global_unicast(&self) -> bool {
        if matches!(self, Addr::V4(b) if *b == [255; 4]) {
            return false;
        }
        !self.is_unspecified()
            && !self.is_loopback()
            && !self.is_multicast()
            && !self.is_link_local_unicast()
    }

    /// The first `bits` bits kept, the rest zeroed.
    fn masked(&self, bits: u8) -> Addr {
        let mut out = *self;
        let b = match &mut out {
            Addr::V4(b) => &mut b[..],
            Addr::V6(b) => &mut b[..],
        };
        for (i, x) in b.iter_mut().enumerate() {
            let keep = usize::from(bits).saturating_sub(i * 8).min(8);
            // the low byte of 0xff00 shifted right by `keep`: the top `keep` bits set
            let [_, mask] = (0xff00u16 >> keep).to_be_bytes();
            *x &= mask;
        }
        out
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::V4(b) => write!(f, "{}.{}.{}.{}", b[0], b[1], b[2], b[3]),
            Addr::V6(b) => {
                let g: Vec<u16> = b
                    .chunks(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect();
                // the first longest run of two or more zero groups becomes `::`
                let (mut zs, mut ze) = (8, 8);
                let mut i = 0;
                while i < 8 {
                    let mut j = i;
                    while j < 8 && g[j] == 0 {
                        j += 1;
                    }
                    if j - i >= 2 && j - i > ze - zs {
                        (zs, ze) = (i, j);
                    }
                    i = j.max(i + 1);
                }
                for (k, x) in g.iter().enumerate() {
                    if k == zs {
                        f.write_str("::")?;
                    } else if k > zs && k < ze {
                        continue;
                    } else {
                        if k != 0 && k != ze {
                            f.write_str(":")?;
                        }
                        write!(f, "{x:x}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl Prefix {
    /// `cidr(s)`: `netip.ParsePrefix` (the address part is kept as written, not masked) plus
    /// the library's refusal of IPv4-mapped IPv6.
    pub fn parse(s: &str) -> Result<Prefix, String> {
        let wrap = |msg: String| {
            format!(
                "network address parse error during conversion from string: network address parse error during conversion from string: netip.ParsePrefix({s:?}): {msg}"
            )
        };
        let Some(slash) = s.rfind('/') else {
            return Err(wrap("no '/'".into()));
        };
        let (a, bits) = (&s[..slash], &s[slash + 1..]);
        let (addr, zoned) = parse_netip(a).map_err(wrap)?;
        if zoned {
            return Err(wrap("IPv6 zones cannot be present in a prefix".into()));
        }
        let bad = || wrap(format!("bad bits after slash: {bits:?}"));
        // no sign, no leading zero (Go checks this before Atoi)
        if bits.is_empty()
            || (bits.len() > 1 && !(b'1'..=b'9').contains(&bits.as_bytes()[0]))
            || !bits.bytes().all(|c| c.is_ascii_digit())
        {
            return Err(bad());
        }
        let n: u32 = bits.parse().map_err(|_| bad())?;
        let max = if addr.family() == 4 { 32 } else { 128 };
        let n = match u8::try_from(n) {
            Ok(n) if n <= max => n,
            _ => return Err(wrap("prefix length out of range".into())),
        };
        if addr.is_4in6() {
            return Err(format!(
                "network address parse error during conversion from string: IPv4-mapped IPv6 address {s:?} is not allowed"
            ));
        }
        Ok(Prefix { addr, bits: n })
    }

    pub fn masked(&self) -> Prefix {
        Prefix {
            addr: self.addr.masked(self.bits),
            bits: self.bits,
        }
    }

    pub fn contains_ip(&self, ip: &Addr) -> bool {
        ip.family() == self.addr.family() && ip.masked(self.bits) == self.addr.masked(self.bits)
    }

    /// Same family, `o` at least as long, and equal under this prefix's mask.
    pub fn contains_prefix(&self, o: &Prefix) -> bool {
        o.addr.family() == self.addr.family()
            && self.bits <= o.bits
            && o.addr.masked(self.bits) == self.addr.masked(self.bits)
    }

    /// cel's `Size()` of a CIDR: the prefix length in whole bytes (the cost of comparisons).
    pub fn byte_len(&self) -> u64 {
        u64::from(self.bits).div_ceil(8)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}
