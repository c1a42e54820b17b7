//! Go's string quoting, as cel-go's libraries print strings: the letter escapes both
//! `strings.quote` and `strconv.Quote` use, and `strconv.Quote` itself (`format`'s `%q`, the
//! messages of the URL library). No CEL value or library code here: the value types and the
//! libraries both use it.

/// The escapes Go writes with a letter (or the character itself) in a quoted string; both
/// `strings.quote` and `strconv.Quote` use them.
pub fn go_escape(c: char) -> Option<&'static str> {
    Some(match c {
        '"' => "\\\"",
        '\\' => "\\\\",
        '\u{7}' => "\\a",
        '\u{8}' => "\\b",
        '\u{c}' => "\\f",
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\u{b}' => "\\v",
        _ => return None,
    })
}

/// Go's `strconv.Quote`. Printability is approximated without Unicode tables: controls,
/// separators other than the space, format characters, private use and non-characters are
/// escaped; unassigned code points are not (Go escapes them).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        let u = c as u32;
        match go_escape(c) {
            Some(e) => out.push_str(e),
            None if go_printable(c) => out.push(c),
            None if u < 0x80 => out.push_str(&format!("\\x{u:02x}")),
            None if u < 0x10000 => out.push_str(&format!("\\u{u:04x}")),
            None => out.push_str(&format!("\\U{u:08x}")),
        }
    }
    out.push('"');
    out
}

fn go_printable(c: char) -> bool {
    let u = c as u32;
    if u < 0x80 {
        return (0x20..0x7f).contains(&u);
    }
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u,
            0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
            | 0x202a..=0x202e | 0x2060..=0x206f | 0xfeff | 0xfff9..=0xfffb | 0x110bd
            | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f
            | 0xe000..=0xf8ff | 0xf0000.. | 0xfdd0..=0xfdef)
        || u & 0xfffe == 0xfffe)
}
