//! URLs for the apiserver's `url` CEL library. Upstream validates with Go's
//! `url.ParseRequestURI` (absolute URI or absolute path, no relative references) and then keeps
//! what `url.Parse` makes of the string (so a `#fragment` is split off); this follows both as far
//! as the accessors can see: scheme, host (with the strict-colons rule of Go 1.26 for http and
//! https), escaped path, raw query.
use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub struct Url {
    scheme: String,
    host: String,
    /// Decoded path and, when the input spelled it differently from Go's escaping, the input.
    path: String,
    raw_path: String,
    raw_query: String,
    // The rest only takes part in equality (Go compares `URL.String()`).
    opaque: String,
    user: Option<(String, Option<String>)>,
    omit_host: bool,
    force_query: bool,
    fragment: String,
    raw_fragment: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Path,
    Host,
    Zone,
    UserPassword,
    QueryComponent,
    Fragment,
}

/// RFC 3986 sub-delims and ':', which hosts and already-escaped paths may hold as they are.
fn sub_delim_or_colon(c: u8) -> bool {
    matches!(
        c,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':'
    )
}

/// Go's `shouldEscape` table.
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(mode, Mode::Host | Mode::Zone)
        && (sub_delim_or_colon(c) || matches!(c, b'[' | b']' | b'<' | b'>' | b'"'))
    {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => c == b'?',
            Mode::UserPassword => matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::QueryComponent => true,
            Mode::Fragment => false,
            Mode::Host | Mode::Zone => true,
        },
        b'!' | b'(' | b')' | b'*' if mode == Mode::Fragment => false,
        _ => true,
    }
}

fn hex(c: u8) -> Option<u8> {
    char::from(c)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Go's `unescape`: `%XX` must be well formed; hosts refuse escaped control bytes and most
/// punctuation; `+` is a space only in query components.
fn unescape(s: &str, mode: Mode) -> Result<String, String> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let (Some(h), Some(l)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                ) else {
                    let end = (i + 3).min(b.len());
                    return Err(format!(
                        "invalid URL escape {:?}",
                        String::from_utf8_lossy(&b[i..end])
                    ));
                };
                let esc = &s[i..i + 3];
                if mode == Mode::Host && h < 8 && esc != "%25" {
                    return Err(format!("invalid URL escape {esc:?}"));
                }
                if mode == Mode::Zone {
                    let v = (h << 4) | l;
                    if esc != "%25" && v != b' ' && should_escape(v, Mode::Host) {
                        return Err(format!("invalid URL escape {esc:?}"));
                    }
                }
                i += 3;
            }
            c => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                    return Err(format!(
                        "invalid character {:?} in host name",
                        (c as char).to_string()
                    ));
                }
                i += 1;
            }
        }
    }
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                out.push((hex(b[i + 1]).unwrap_or(0) << 4) | hex(b[i + 2]).unwrap_or(0));
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    // Go strings hold any bytes; ours must be UTF-8 (only visible with escaped non-UTF-8)
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn escape(s: &str, mode: Mode) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c == b' ' && mode == Mode::QueryComponent {
            out.push('+');
        } else if should_escape(c, mode) {
            out.push_str(&format!("%{c:02X}"));
        } else {
            out.push(c as char);
        }
    }
    out
}

fn valid_optional_port(p: &str) -> bool {
    p.is_empty() || (p.starts_with(':') && p[1..].bytes().all(|c| c.is_ascii_digit()))
}

fn valid_userinfo(s: &str) -> bool {
    s.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '-' | '.'
                    | '_'
                    | ':'
                    | '~'
                    | '!'
                    | '$'
                    | '&'
                    | '\''
                    | '('
                    | ')'
                    | '*'
                    | '+'
                    | ','
                    | ';'
                    | '='
                    | '%'
                    | '@'
            )
    })
}

fn parse_host(scheme: &str, host: &str) -> Result<String, String> {
    match host.rfind('[') {
        Some(i) if i > 0 => return Err("invalid IP-literal".into()),
        Some(_) => {
            let Some(close) = host.rfind(']') else {
                return Err("missing ']' in host".into());
            };
            let colon_port = &host[close + 1..];
            if !valid_optional_port(colon_port) {
                return Err(format!("invalid port {colon_port:?} after host"));
            }
            let port = unescape(colon_port, Mode::Host)?;
            let name = &host[1..close];
            let unescaped = match name.find("%25") {
                Some(z) => unescape(&name[..z], Mode::Host)? + &unescape(&name[z..], Mode::Zone)?,
                None => unescape(name, Mode::Host)?,
            };
            // any IPv6 literal `netip` takes, zones included
            let (addr, _) =
                super::net::parse_netip(&unescaped).map_err(|e| format!("invalid host: {e}"))?;
            if addr.family() == 4 {
                return Err("invalid IP-literal".into());
            }
            return Ok(format!("[{unescaped}]{port}"));
        }
        None => {
            if let Some(first) = host.find(':') {
                let last = host.rfind(':').unwrap_or(first);
                // Go 1.26 (urlstrictcolons=1): http(s) hosts take the first colon
                let i = if last != first && scheme != "http" && scheme != "https" {
                    last
                } else {
                    first
                };
                let colon_port = &host[i..];
                if !valid_optional_port(colon_port) {
                    return Err(format!("invalid port {colon_port:?} after host"));
                }
            }
        }
    }
    unescape(host, Mode::Host)
}

/// Go's `parse(raw, viaRequest)`, the part before any fragment split.
fn parse_go(raw: &str, via_request: bool) -> Result<Url, String> {
    if raw.bytes().any(|b| b < b' ' || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let mut u = Url::default();
    if raw == "*" {
        u.path = "*".into();
        return Ok(u);
    }
    // scheme: a letter, then letters, digits, `+-.`, up to the first `:`
    let mut rest = raw;
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => {
                u.scheme = raw[..i].to_ascii_lowercase();
                rest = &raw[i + 1..];
                break;
            }
            _ => break,
        }
    }
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        u.force_query = true;
        rest = &rest[..rest.len() - 1];
    } else if let Some((r, q)) = rest.split_once('?') {
        u.raw_query = q.to_string();
        rest = r;
    }
    if !rest.starts_with('/') {
        if !u.scheme.is_empty() {
            u.opaque = rest.to_string();
            return Ok(u);
        }
        if via_request {
            return Err("invalid URI for request".into());
        }
        if rest.split('/').next().unwrap_or("").contains(':') {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    if (!u.scheme.is_empty() || !via_request && !rest.starts_with("///")) && rest.starts_with("//")
    {
        let auth = &rest[2..];
        let (auth, path) = match auth.find('/') {
            Some(i) => (&auth[..i], &auth[i..]),
            None => (auth, ""),
        };
        rest = path;
        let (user, host) = match auth.rfind('@') {
            Some(i) => (Some(&auth[..i]), &auth[i + 1..]),
            None => (None, auth),
        };
        u.host = parse_host(&u.scheme, host)?;
        if let Some(ui) = user {
            if !valid_userinfo(ui) {
                return Err("net/url: invalid userinfo".into());
            }
            u.user = Some(match ui.split_once(':') {
                Some((n, p)) => (
                    unescape(n, Mode::UserPassword)?,
                    Some(unescape(p, Mode::UserPassword)?),
                ),
                None => (unescape(ui, Mode::UserPassword)?, None),
            });
        }
    } else if !u.scheme.is_empty() && rest.starts_with('/') {
        u.omit_host = true;
    }
    (u.path, u.raw_path) = decode(rest, Mode::Path)?;
    Ok(u)
}

/// Decoded text, and the input when Go's escaping of the decoded text would spell it
/// differently (`RawPath`, `RawFragment`).
fn decode(s: &str, mode: Mode) -> Result<(String, String), String> {
    let d = unescape(s, mode)?;
    let raw = if escape(&d, mode) == s {
        String::new()
    } else {
        s.to_string()
    };
    Ok((d, raw))
}

/// `EscapedPath` / `EscapedFragment`: the input spelling when it is valid and means the same.
fn escaped(decoded: &str, raw: &str, mode: Mode) -> String {
    if !raw.is_empty() && valid_encoded(raw, mode) && unescape(raw, mode).as_deref() == Ok(decoded)
    {
        return raw.to_string();
    }
    if mode == Mode::Path && decoded == "*" {
        return "*".into();
    }
    escape(decoded, mode)
}

impl Url {
    /// `isURL(s)`: whether `ParseRequestURI` takes it (a bad fragment escape is not checked).
    pub fn is_request_uri(s: &str) -> bool {
        parse_go(s, true).is_ok()
    }

    /// The error `url.ParseRequestURI` gives for `s`, as Go prints it; `None` when it parses.
    pub fn request_uri_error(s: &str) -> Option<String> {
        parse_go(s, true)
            .err()
            .map(|e| format!("parse {}: {e}", crate::cel::quote::go_quote(s)))
    }

    /// `url(s)`: must pass `ParseRequestURI`; the value is what `Parse` makes of it.
    pub fn parse(s: &str) -> Result<Url, String> {
        let err = |e: String| format!("URL parse error during conversion from string: {e}");
        parse_go(s, true).map_err(|e| err(format!("parse {s:?}: {e}")))?;
        let (front, frag) = s.split_once('#').unwrap_or((s, ""));
        let mut u = parse_go(front, false).map_err(|e| err(format!("parse {front:?}: {e}")))?;
        if !frag.is_empty() {
            (u.fragment, u.raw_fragment) =
                decode(frag, Mode::Fragment).map_err(|e| err(format!("parse {s:?}: {e}")))?;
        }
        Ok(u)
    }

    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// `host` without the port and IPv6 brackets, and the port (Go's `splitHostPort`).
    fn split_host_port(&self) -> (&str, &str) {
        let mut host = self.host.as_str();
        let mut port = "";
        if let Some(c) = host.rfind(':')
            && valid_optional_port(&host[c..])
        {
            port = &host[c + 1..];
            host = &host[..c];
        }
        if host.starts_with('[') && host.ends_with(']') && host.len() >= 2 {
            host = &host[1..host.len() - 1];
        }
        (host, port)
    }

    pub fn hostname(&self) -> &str {
        self.split_host_port().0
    }

    pub fn port(&self) -> &str {
        self.split_host_port().1
    }

    pub fn escaped_path(&self) -> String {
        escaped(&self.path, &self.raw_path, Mode::Path)
    }

    /// `url.ParseQuery`, ignoring the pairs it rejects (semicolons, bad escapes) as Go's
    /// `Query()` does.
    pub fn query(&self) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pair in self.raw_query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let (Ok(k), Ok(v)) = (
                unescape(k, Mode::QueryComponent),
                unescape(v, Mode::QueryComponent),
            ) else {
                continue;
            };
            m.entry(k).or_default().push(v);
        }
        m
    }

    /// Equality: upstream compares `URL.String()`, which these parts determine.
    pub fn same(&self, o: &Url) -> bool {
        fn key(u: &Url) -> impl PartialEq + '_ {
            (
                (&u.scheme, &u.opaque, &u.user, &u.host, u.omit_host),
                u.escaped_path(),
                (u.force_query || !u.raw_query.is_empty(), &u.raw_query),
                (!u.fragment.is_empty())
                    .then(|| escaped(&u.fragment, &u.raw_fragment, Mode::Fragment)),
            )
        }
        key(self) == key(o)
    }
}

fn valid_encoded(s: &str, mode: Mode) -> bool {
    s.bytes().all(|c| {
        sub_delim_or_colon(c) || matches!(c, b'@' | b'[' | b']' | b'%') || !should_escape(c, mode)
    })
}
