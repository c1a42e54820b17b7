//! The Kubernetes format library of the base environment (`format.named`, `format.<name>()`,
//! `<format>.validate(string)`): the named formats, their validators with the apimachinery and
//! kube-openapi rules and messages, and what a `validate` call costs at run time.

/// How a named format validates a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// `NameIsDNSLabel(s, prefix)`
    Dns1123Label { prefix: bool },
    /// `NameIsDNSSubdomain(s, prefix)`
    Dns1123Subdomain { prefix: bool },
    /// `NameIsDNS1035Label(s, prefix)`
    Dns1035Label { prefix: bool },
    /// `IsQualifiedName` (a label key)
    QualifiedName,
    /// `IsValidLabelValue`
    LabelValue,
    /// `url.ParseRequestURI`
    Uri,
    /// strfmt `uuid`
    Uuid,
    /// strfmt `byte` (standard base64 with padding)
    Byte,
    /// strfmt `date` (RFC 3339 full-date)
    Date,
    /// strfmt `datetime`
    DateTime,
}

/// A value of the CEL type `kubernetes.NamedFormat`.
#[derive(Debug)]
pub struct NamedFormat {
    /// The name `format.named` takes and `format.<key>()` is called by.
    pub key: &'static str,
    /// The format's own name; two formats are equal when these are.
    pub name: &'static str,
    /// The regex size upstream assumes for the cost of `validate` (priced as a regex match).
    pub max_regex_size: u64,
    rule: Rule,
}

/// Every named format, in the order upstream lists them.
pub static FORMATS: [NamedFormat; 13] = [
    NamedFormat {
        key: "dns1123Label",
        name: "DNS1123Label",
        max_regex_size: 30,
        rule: Rule::Dns1123Label { prefix: false },
    },
    NamedFormat {
        key: "dns1123Subdomain",
        name: "DNS1123Subdomain",
        max_regex_size: 60,
        rule: Rule::Dns1123Subdomain { prefix: false },
    },
    NamedFormat {
        key: "dns1035Label",
        name: "DNS1035Label",
        max_regex_size: 30,
        rule: Rule::Dns1035Label { prefix: false },
    },
    NamedFormat {
        key: "qualifiedName",
        name: "QualifiedName",
        max_regex_size: 60,
        rule: Rule::QualifiedName,
    },
    NamedFormat {
        key: "dns1123LabelPrefix",
        name: "DNS1123LabelPrefix",
        max_regex_size: 30,
        rule: Rule::Dns1123Label { prefix: true },
    },
    NamedFormat {
        key: "dns1123SubdomainPrefix",
        name: "DNS1123SubdomainPrefix",
        max_regex_size: 60,
        rule: Rule::Dns1123Subdomain { prefix: true },
    },
    NamedFormat {
        key: "dns1035LabelPrefix",
        name: "DNS1035LabelPrefix",
        max_regex_size: 30,
        rule: Rule::Dns1035Label { prefix: true },
    },
    NamedFormat {
        key: "labelValue",
        name: "LabelValue",
        max_regex_size: 40,
        rule: Rule::LabelValue,
    },
    // govalidator's URL regex length (ParseRequestURI itself has none)
    NamedFormat {
        key: "uri",
        name: "URI",
        max_regex_size: 1103,
        rule: Rule::Uri,
    },
    // the length of strfmt's UUID pattern
    NamedFormat {
        key: "uuid",
        name: "uuid",
        max_regex_size: 70,
        rule: Rule::Uuid,
    },
    // govalidator's base64 regex length
    NamedFormat {
        key: "byte",
        name: "byte",
        max_regex_size: 84,
        rule: Rule::Byte,
    },
    // both dates use the length of strfmt's date-time pattern
    NamedFormat {
        key: "date",
        name: "date",
        max_regex_size: 71,
        rule: Rule::Date,
    },
    NamedFormat {
        key: "datetime",
        name: "datetime",
        max_regex_size: 71,
        rule: Rule::DateTime,
    },
];

/// The format `format.named(key)` / `format.<key>()` gives.
pub fn lookup(key: &str) -> Option<&'static NamedFormat> {
    FORMATS.iter().find(|f| f.key == key)
}

/// Where in [`FORMATS`] the format behind the function `format.<key>` is (the checker sees a
/// call's full name); small, so a `Func` carries it in a byte.
pub fn function_index(name: &str) -> Option<u8> {
    let key = name.strip_prefix("format.")?;
    let i = FORMATS.iter().position(|f| f.key == key)?;
    u8::try_from(i).ok()
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// apimachinery's `RegexError`: the message, the examples, and the regex.
fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    let mut out = msg.to_string();
    if examples.is_empty() {
        out.push_str(&format!(" (regex used for validation is '{re}')"));
        return out;
    }
    out.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{re}')"));
    out
}

/// The length error: `util/validation` counts "characters", the newer `validate/content`
/// (label keys and values) "bytes"; both compare byte lengths.
fn max_len_error(max: usize, unit: &str) -> String {
    format!("must be no more than {max} {unit}")
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, or with `alpha_first` the DNS-1035 form.
fn is_label(s: &[u8], alpha_first: bool) -> bool {
    let end_ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (s.first(), s.last()) {
        (Some(&f), Some(&l)) => {
            (if alpha_first {
                f.is_ascii_lowercase()
            } else {
                end_ok(f)
            }) && end_ok(l)
                && s.iter().all(|&c| end_ok(c) || c == b'-')
        }
        _ => false,
    }
}

fn is_subdomain(s: &[u8]) -> bool {
    s.split(|&c| c == b'.').all(|l| is_label(l, false))
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_label_key_name(s: &[u8]) -> bool {
    match (s.first(), s.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && s.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// apimachinery's `maskTrailingDash` for generated-name prefixes: a trailing dash of a name
/// longer than one byte is replaced, together with the byte before it, by `a`.
fn mask_trailing_dash(s: &[u8]) -> Vec<u8> {
    if s.len() > 1 && s.ends_with(b"-") {
        let mut v = s[..s.len() - 2].to_vec();
        v.push(b'a');
        v
    } else {
        s.to_vec()
    }
}

fn dns1123_label(s: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63, "characters"));
    }
    if !is_label(s, false) {
        if is_subdomain(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `IsDNS1123Subdomain`; `unit` tells which package's length message.
fn dns1123_subdomain(s: &[u8], unit: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253, unit));
    }
    if !is_subdomain(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

fn dns1035_label(s: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63, "characters"));
    }
    if !is_label(s, true) {
        errs.push(regex_error(
            DNS1035_LABEL_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `IsLabelKey`: an optional DNS subdomain prefix and `/`, then a name.
fn qualified_name(s: &[u8]) -> Vec<String> {
    let examples = ["MyName", "my.name", "123-abc"];
    let parts: Vec<&[u8]> = s.split(|&c| c == b'/').collect();
    let mut errs = Vec::new();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix, "bytes")
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &examples)
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63, "bytes")));
    }
    if !is_label_key_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &examples)
        ));
    }
    errs
}

fn label_value(s: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63, "bytes"));
    }
    if !(s.is_empty() || is_label_key_name(s)) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// strfmt's `(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$`.
fn is_uuid(s: &str) -> bool {
    let mut b = s.as_bytes();
    for (i, n) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if i > 0 && b.first() == Some(&b'-') {
            b = &b[1..];
        }
        if b.len() < n || !b[..n].iter().all(u8::is_ascii_hexdigit) {
            return false;
        }
        b = &b[n..];
    }
    b.is_empty()
}

/// govalidator's base64 pattern: whole groups of four from the standard alphabet, the last
/// one possibly ending in `=` or `==`; not empty.
fn is_base64(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return false;
    }
    let alpha = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/');
    let pad = if b.ends_with(b"==") {
        2
    } else if b.ends_with(b"=") {
        1
    } else {
        0
    };
    b[..b.len() - pad].iter().all(alpha)
}

fn days_in(month: u32, year: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn digits(b: &[u8]) -> Option<u32> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, &c| n * 10 + u32::from(c - b'0')))
}

/// Go's `time.Parse("2006-01-02", s)` succeeding: four-digit year, two-digit month 1-12, two-digit
/// day that exists in that month, nothing more.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let (Some(y), Some(m), Some(d)) = (digits(&b[..4]), digits(&b[5..7]), digits(&b[8..])) else {
        return false;
    };
    (1..=12).contains(&m) && d >= 1 && d <= days_in(m, y)
}

/// `[+-][0-9]{2}:[0-9]{2}` or `z` (after lowercasing), the whole of `t`.
fn is_zone(t: &[char]) -> bool {
    match t {
        ['z' | 'Z'] => true,
        ['+' | '-', a, b, ':', c, d] => [a, b, c, d].iter().all(|c| c.is_ascii_digit()),
        _ => false,
    }
}

/// strfmt's `IsDateTime`: a date before the first `t`/`T`, and between it and the next one
/// `^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$` (after lowercasing)
/// with hours up to 23 and minutes and seconds up to 59.
fn is_datetime(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let mut parts = s.split(['t', 'T']);
    let date = parts.next().unwrap_or("");
    let Some(time) = parts.next() else {
        return false;
    };
    if !is_date(date) {
        return false;
    }
    let t: Vec<char> = time.chars().collect();
    if t.len() < 9 || t[2] != ':' || t[5] != ':' {
        return false;
    }
    let two = |i: usize| Some(t[i].to_digit(10)? * 10 + t[i + 1].to_digit(10)?);
    let (Some(h), Some(m), Some(sec)) = (two(0), two(3), two(6)) else {
        return false;
    };
    let rest = &t[8..];
    let tail_ok = is_zone(rest)
        || match rest.split_first() {
            // `.` is any character but a newline, then at least one digit, then the zone
            Some((&c, more)) if c != '\n' => {
                let n = more.iter().take_while(|c| c.is_ascii_digit()).count();
                n > 0 && is_zone(&more[n..])
            }
            _ => false,
        };
    tail_ok && h <= 23 && m <= 59 && sec <= 59
}

impl NamedFormat {
    /// The validator's messages for `s`; empty when it is valid.
    pub fn validate(&self, s: &str) -> Vec<String> {
        let b = s.as_bytes();
        let masked = |prefix: bool| {
            if prefix {
                mask_trailing_dash(b)
            } else {
                b.to_vec()
            }
        };
        let one = |ok: bool, msg: &str| {
            if ok {
                Vec::new()
            } else {
                vec![msg.to_string()]
            }
        };
        match self.rule {
            Rule::Dns1123Label { prefix } => dns1123_label(&masked(prefix)),
            Rule::Dns1123Subdomain { prefix } => dns1123_subdomain(&masked(prefix), "characters"),
            Rule::Dns1035Label { prefix } => dns1035_label(&masked(prefix)),
            Rule::QualifiedName => qualified_name(b),
            Rule::LabelValue => label_value(b),
            Rule::Uri => super::url::Url::request_uri_error(s).into_iter().collect(),
            Rule::Uuid => one(is_uuid(s), "does not match the UUID format"),
            Rule::Byte => one(is_base64(s), "invalid base64"),
            Rule::Date => one(is_date(s), "invalid date"),
            Rule::DateTime => one(is_datetime(s), "invalid datetime"),
        }
    }
}
