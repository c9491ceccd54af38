//! Reading and validating a tenants file (format in [`super`]). Every error
//! reads `PATH:LINE: what`: TOML values carry their spans
//! ([`toml::Spanned`]); in JSON, [`JsonPlaces`] finds where each value
//! starts.

use std::collections::HashMap;
use std::fmt;
use std::io::Read as _;
use std::path::Path;

use loadgate::Class;
use serde::Deserialize;
use toml::Spanned;

use super::redact::without_strings;
use super::tenant::{Tenant, DEFAULT_TENANT};

/// The largest tenants file read (1 MiB).
pub(super) const MAX_FILE_BYTES: u64 = 1 << 20;
/// The most tenants a file names (its `default` included).
pub(super) const MAX_TENANTS: usize = 1000;
/// The longest tenant name.
const MAX_NAME_LEN: usize = 64;
/// The largest weight.
const MAX_WEIGHT: i64 = 1000;
/// A name no tenant may take.
const RESERVED_NAME: &str = "other";

/// The file as written: `[[tenant]]` entries, strings `S` and integers `I`
/// spanned (TOML) or plain (JSON).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = r#"an object, {"tenant": [...]}"#)]
struct RawFile<S, I> {
    #[serde(default = "Vec::new")]
    tenant: Vec<RawEntry<S, I>>,
}

/// One `[[tenant]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a tenant (name, keys, weight, ...)")]
struct RawEntry<S, I> {
    name: S,
    #[serde(default = "Vec::new")]
    keys: Vec<S>,
    weight: Option<I>,
    max_class: Option<S>,
    max_waiting: Option<I>,
    max_tokens: Option<I>,
}

/// A value and the byte offset where it starts.
struct At<T> {
    value: T,
    at: usize,
}

impl<T> From<Spanned<T>> for At<T> {
    fn from(spanned: Spanned<T>) -> Self {
        At { at: spanned.span().start, value: spanned.into_inner() }
    }
}

/// One entry with the place of each value, whatever the format.
struct Entry {
    name: At<String>,
    keys: Vec<At<String>>,
    weight: Option<At<i64>>,
    max_class: Option<At<String>>,
    max_waiting: Option<At<i64>>,
    max_tokens: Option<At<i64>>,
}

/// The 1-based line holding `byte_offset` of `text` (the last line past the end).
fn line_of(text: &str, byte_offset: usize) -> usize {
    let end = byte_offset.min(text.len());
    1 + text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count()
}

/// The text of the file at `path`, refused past [`MAX_FILE_BYTES`] before
/// it is read.
pub(super) fn read(path: &Path) -> Result<String, String> {
    let origin = path.display();
    let too_large = |len: u64| format!("{origin}: the file is {len} bytes, more than {MAX_FILE_BYTES} (1 MiB)");
    let file = std::fs::File::open(path).map_err(|e| format!("{origin}: cannot open: {e}"))?;
    let len = file.metadata().map_err(|e| format!("{origin}: cannot read: {e}"))?.len();
    if len > MAX_FILE_BYTES {
        return Err(too_large(len));
    }
    // The limit again while reading: the file may grow meanwhile.
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(|e| format!("{origin}: cannot read: {e}"))?;
    match u64::try_from(text.len()) {
        Ok(len) if len <= MAX_FILE_BYTES => Ok(text),
        _ => Err(too_large(MAX_FILE_BYTES + 1)),
    }
}

/// Parses and validates `text` (JSON when `json`; a byte order mark first
/// skipped), `origin` naming it in errors. The result has the `default`
/// tenant first, then the others in file order.
pub(super) fn parse(text: &str, json: bool, origin: &str) -> Result<Vec<Tenant>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let entries = match json {
        true => json_entries(text, origin)?,
        false => toml_entries(text, origin)?,
    };
    let report = Report { text, origin };
    Checker { report, names: HashMap::new(), hashes: HashMap::new() }.tenants(entries)
}

fn toml_entries(text: &str, origin: &str) -> Result<Vec<Entry>, String> {
    let file: RawFile<Spanned<String>, Spanned<i64>> = toml::from_str(text).map_err(|e| {
        let what = without_strings(e.message().trim_end());
        match e.span() {
            Some(span) => format!("{origin}:{}: {what}", line_of(text, span.start)),
            None => format!("{origin}: {what}"),
        }
    })?;
    let entries = file.tenant.into_iter().map(|raw| Entry {
        name: raw.name.into(),
        keys: raw.keys.into_iter().map(At::from).collect(),
        weight: raw.weight.map(At::from),
        max_class: raw.max_class.map(At::from),
        max_waiting: raw.max_waiting.map(At::from),
        max_tokens: raw.max_tokens.map(At::from),
    });
    Ok(entries.collect())
}

fn json_entries(text: &str, origin: &str) -> Result<Vec<Entry>, String> {
    let start = text.len() - text.trim_start().len();
    match text.as_bytes().get(start) {
        None => return Ok(Vec::new()),
        // Not serde's sequence form of the object (`[]`: no tenants).
        Some(b'{') => {}
        Some(_) => return Err(Report { text, origin }.error(start, r#"the file is one object, {"tenant": [...]}"#)),
    }
    let file: RawFile<String, i64> = serde_json::from_str(text).map_err(|e| {
        let what = without_strings(&e.to_string());
        let what = what.strip_suffix(&format!(" at line {} column {}", e.line(), e.column())).unwrap_or(&what);
        match e.line() {
            0 => format!("{origin}: {what}"),
            line => format!("{origin}:{line}: {what}"),
        }
    })?;
    let places = JsonPlaces::find(text);
    let entries = file.tenant.into_iter().enumerate().map(|(index, raw)| {
        let places = places.get(index);
        let at = |field: &str| places.map_or(0, |p| p.of(field));
        let key_at = |i: usize| places.and_then(|p| p.keys.get(i).copied()).unwrap_or_else(|| at("keys"));
        let keys = raw.keys.into_iter().enumerate();
        Entry {
            name: At { at: at("name"), value: raw.name },
            keys: keys.map(|(i, value)| At { at: key_at(i), value }).collect(),
            weight: raw.weight.map(|value| At { at: at("weight"), value }),
            max_class: raw.max_class.map(|value| At { at: at("max_class"), value }),
            max_waiting: raw.max_waiting.map(|value| At { at: at("max_waiting"), value }),
            max_tokens: raw.max_tokens.map(|value| At { at: at("max_tokens"), value }),
        }
    });
    Ok(entries.collect())
}

/// The text being checked, for errors naming its lines.
#[derive(Clone, Copy)]
struct Report<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Report<'_> {
    /// `origin:line: what`, the line of `at`.
    fn error(self, at: usize, what: impl fmt::Display) -> String {
        format!("{}:{}: {what}", self.origin, line_of(self.text, at))
    }
}

/// Validates entries into tenants, remembering names and key hashes seen.
struct Checker<'a> {
    report: Report<'a>,
    /// Name → the line it was first given on.
    names: HashMap<String, usize>,
    /// Key hash → the tenant holding it and its line.
    hashes: HashMap<[u8; 32], (String, usize)>,
}

impl Checker<'_> {
    fn tenants(mut self, entries: Vec<Entry>) -> Result<Vec<Tenant>, String> {
        let mut default = None;
        let mut others = Vec::with_capacity(entries.len());
        for (index, entry) in entries.into_iter().enumerate() {
            if index == MAX_TENANTS {
                return Err(self.report.error(entry.name.at, format_args!("more than {MAX_TENANTS} tenants")));
            }
            let tenant = self.tenant(entry)?;
            match tenant.name == DEFAULT_TENANT {
                true => default = Some(tenant),
                false => others.push(tenant),
            }
        }
        let mut tenants = vec![default.unwrap_or_else(Tenant::implicit_default)];
        tenants.extend(others);
        Ok(tenants)
    }

    fn tenant(&mut self, entry: Entry) -> Result<Tenant, String> {
        let Entry { name, keys, weight, max_class, max_waiting, max_tokens } = entry;
        let who = format!("tenant {}", quoted(&name.value));
        let report = self.report;
        let fail = |at: usize, what: String| report.error(at, format_args!("{who}: {what}"));
        if !valid_name(&name.value) {
            return Err(fail(name.at, format!("a name is 1 to {MAX_NAME_LEN} characters among a-z, 0-9, _ and -")));
        }
        if name.value == RESERVED_NAME {
            return Err(fail(name.at, format!("the name {RESERVED_NAME:?} is reserved")));
        }
        if let Some(line) = self.names.get(&name.value) {
            return Err(fail(name.at, format!("the name is already used on line {line}")));
        }
        if let (true, Some(key)) = (name.value == DEFAULT_TENANT, keys.first()) {
            let what = "the default tenant (requests with no key or an unknown one) cannot have keys";
            return Err(fail(key.at, what.to_owned()));
        }
        let weight = match weight {
            None => 1,
            Some(At { value, at }) => match u32::try_from(value) {
                Ok(weight) if (1..=MAX_WEIGHT).contains(&value) => weight,
                _ => return Err(fail(at, format!("weight must be 1..={MAX_WEIGHT}, not {value}"))),
            },
        };
        let max_class = match max_class {
            None => Class::Standard,
            Some(At { value, at }) => value.parse().map_err(|_| {
                fail(at, format!("max_class must be critical, standard or sheddable, not {}", quoted(&value)))
            })?,
        };
        let capped = |field: &str, cap: Option<At<i64>>| {
            at_least_one(cap).map_err(|(at, value)| fail(at, format!("{field} must be at least 1, not {value}")))
        };
        let max_waiting = capped("max_waiting", max_waiting)?;
        let max_tokens = capped("max_tokens", max_tokens)?;
        let mut hashes = Vec::with_capacity(keys.len());
        for (number, key) in (1..).zip(&keys) {
            let Some(hash) = key_hash(&key.value) else {
                // The value is not echoed: it may be a key pasted by mistake.
                let what = "is not \"sha256:\" and 64 hex digits (the SHA-256 of the API key, never the key itself)";
                return Err(fail(key.at, format!("key {number} {what}")));
            };
            if let Some((holder, line)) = self.hashes.get(&hash) {
                let what = format!("key {number} is already a key of tenant {} (line {line})", quoted(holder));
                return Err(fail(key.at, what));
            }
            self.hashes.insert(hash, (name.value.clone(), line_of(report.text, key.at)));
            hashes.push(hash);
        }
        self.names.insert(name.value.clone(), line_of(report.text, name.at));
        Ok(Tenant {
            name: name.value,
            weight,
            max_class,
            max_waiting: max_waiting.map(|v| usize::try_from(v).unwrap_or(usize::MAX)),
            max_tokens,
            keys: hashes,
        })
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len())
        && name.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

/// A cap (`None`: none), or the place and value of one below 1.
fn at_least_one(cap: Option<At<i64>>) -> Result<Option<u64>, (usize, i64)> {
    match cap {
        None => Ok(None),
        Some(At { value, at }) => u64::try_from(value).ok().filter(|&v| v >= 1).map(Some).ok_or((at, value)),
    }
}

/// `text` quoted for a message, cut after 64 characters.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(MAX_NAME_LEN) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// `sha256:<64 hex digits>` (either case) as the hash's bytes.
pub(super) fn key_hash(text: &str) -> Option<[u8; 32]> {
    // Digits only: `from_str_radix` alone would take a `+` sign.
    let hex =
        text.strip_prefix("sha256:").filter(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))?;
    let mut hash = [0; 32];
    for (byte, at) in hash.iter_mut().zip((0..).step_by(2)) {
        *byte = u8::from_str_radix(&hex[at..at + 2], 16).ok()?;
    }
    Some(hash)
}

/// Where the values of one JSON tenant object start.
#[derive(Default)]
struct JsonPlaces<'a> {
    /// The object's `{`.
    entry: usize,
    /// Field name (as written) → where its value starts.
    fields: Vec<(&'a str, usize)>,
    /// Where each string of `keys` starts.
    keys: Vec<usize>,
}

impl<'a> JsonPlaces<'a> {
    /// Where `field`'s value starts (the object's start if it has none).
    fn of(&self, field: &str) -> usize {
        self.fields.iter().find(|(name, _)| *name == field).map_or(self.entry, |&(_, at)| at)
    }

    /// The places of each object of `tenant` in `text`, a JSON document
    /// that already parsed (anything unexpected ends the walk early).
    fn find(text: &'a str) -> Vec<JsonPlaces<'a>> {
        let mut walk = JsonWalk { text, at: 0, path: Vec::new(), places: Vec::new() };
        let _ = walk.value();
        walk.places
    }
}

/// One step of the path to a JSON value.
enum Step<'a> {
    Key(&'a str),
    Index,
}

/// A walk over a JSON text noting where tenant values start.
struct JsonWalk<'a> {
    text: &'a str,
    at: usize,
    path: Vec<Step<'a>>,
    places: Vec<JsonPlaces<'a>>,
}

impl<'a> JsonWalk<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    /// Skips `byte` (and the space before it) if it comes next.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_space();
        let next = self.peek() == Some(byte);
        self.at += usize::from(next);
        next
    }

    /// A string's raw content (escapes kept).
    fn string(&mut self) -> Option<&'a str> {
        (self.peek() == Some(b'"')).then_some(())?;
        let bytes = self.text.as_bytes();
        let start = self.at + 1;
        let mut end = start;
        loop {
            match *bytes.get(end)? {
                b'"' => break,
                b'\\' => end += 2,
                _ => end += 1,
            }
        }
        self.at = end + 1;
        self.text.get(start..end)
    }

    fn value(&mut self) -> Option<()> {
        self.skip_space();
        self.note();
        match self.peek()? {
            b'{' => {
                self.at += 1;
                while !self.eat(b'}') {
                    self.skip_space();
                    let key = self.string()?;
                    self.eat(b':').then_some(())?;
                    self.path.push(Step::Key(key));
                    self.value()?;
                    self.path.pop();
                    self.eat(b',');
                }
            }
            b'[' => {
                self.at += 1;
                while !self.eat(b']') {
                    self.path.push(Step::Index);
                    self.value()?;
                    self.path.pop();
                    self.eat(b',');
                }
            }
            b'"' => {
                self.string()?;
            }
            _ => {
                let scalar = |b: u8| !matches!(b, b',' | b'}' | b']') && !b.is_ascii_whitespace();
                let start = self.at;
                while self.peek().is_some_and(scalar) {
                    self.at += 1;
                }
                (self.at > start).then_some(())?;
            }
        }
        Some(())
    }

    /// Notes where the value at the current path starts, if it is a tenant's.
    fn note(&mut self) {
        let at = self.at;
        match self.path.as_slice() {
            [Step::Key("tenant"), Step::Index] => self.places.push(JsonPlaces { entry: at, ..JsonPlaces::default() }),
            [Step::Key("tenant"), Step::Index, Step::Key(field)] => {
                if let Some(places) = self.places.last_mut() {
                    places.fields.push((*field, at));
                }
            }
            [Step::Key("tenant"), Step::Index, Step::Key("keys"), Step::Index] => {
                if let Some(places) = self.places.last_mut() {
                    places.keys.push(at);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hash_key;
    use super::*;

    fn toml_error(text: &str) -> String {
        parse(text, false, "t.toml").unwrap_err()
    }

    fn json_error(text: &str) -> String {
        parse(text, true, "t.json").unwrap_err()
    }

    /// `hash_key(key)` with its hex in capitals.
    fn upper_hash(key: &str) -> String {
        format!("sha256:{}", hash_key(key)["sha256:".len()..].to_uppercase())
    }

    #[test]
    fn toml_and_json_give_the_same_tenants() {
        let (a, b, c) = (hash_key("key-a"), upper_hash("key-b"), hash_key("key-c"));
        let toml = format!(
            "# tenants\n[[tenant]]\nname = \"acme\"\nkeys = [\"{a}\", \"{b}\"]\nweight = 10\nmax_class = \"critical\"\n\
             max_waiting = 100\nmax_tokens = 200000\n\n[[tenant]]\nname = \"default\"\nweight = 2\n\n\
             [[tenant]]\nname = \"batch-jobs_2\"\nkeys = [\"{c}\"]\nmax_class = \"sheddable\"\n"
        );
        let json = format!(
            r#"{{"tenant": [
                {{"name": "acme", "keys": ["{a}", "{b}"], "weight": 10, "max_class": "critical",
                  "max_waiting": 100, "max_tokens": 200000}},
                {{"name": "default", "weight": 2}},
                {{"keys": ["{c}"], "name": "batch-jobs_2", "max_class": "sheddable"}}
            ]}}"#
        );
        let from_toml = parse(&toml, false, "t.toml").unwrap();
        assert_eq!(from_toml, parse(&json, true, "t.json").unwrap());
        let names: Vec<_> = from_toml.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["default", "acme", "batch-jobs_2"], "default first, then file order");
        let acme = &from_toml[1];
        assert_eq!(
            (acme.weight, acme.max_class, acme.max_waiting, acme.max_tokens),
            (10, Class::Critical, Some(100), Some(200_000))
        );
        assert_eq!(acme.keys, [key_hash(&a).unwrap(), key_hash(&hash_key("key-b")).unwrap()], "either case");
        assert_eq!((from_toml[0].weight, from_toml[0].max_class), (2, Class::Standard));
        let batch = &from_toml[2];
        assert_eq!(
            (batch.weight, batch.max_class, batch.max_waiting, batch.max_tokens),
            (1, Class::Sheddable, None, None)
        );
    }

    #[test]
    fn empty_files_have_only_the_implicit_default() {
        for (text, json) in
            [("", false), ("# nothing\n", false), ("", true), (" \n", true), (r#"{"tenant": []}"#, true)]
        {
            let tenants = parse(text, json, "t").unwrap();
            assert_eq!(tenants, [Tenant::implicit_default()], "{text:?}");
        }
    }

    #[test]
    fn toml_errors_name_the_line() {
        let (a, b) = (hash_key("key-a"), hash_key("key-b"));
        let upper_a = upper_hash("key-a");
        let cases = [
            ("[[tenant]]\nname = \"acme\"\nkeys = []\nweight = 0\n", "t.toml:4: tenant \"acme\": weight must be 1..=1000, not 0"),
            ("[[tenant]]\nname = \"acme\"\n\n\nweight = 1001\n", "t.toml:5: tenant \"acme\": weight must be 1..=1000, not 1001"),
            ("\n[[tenant]]\nname = \"Acme\"\n", "t.toml:3: tenant \"Acme\": a name is 1 to 64 characters among a-z, 0-9, _ and -"),
            ("[[tenant]]\nname = \"\"\n", "t.toml:2: tenant \"\": a name is 1 to 64"),
            ("[[tenant]]\nname = \"a b\"\n", "t.toml:2: tenant \"a b\": a name is"),
            ("[[tenant]]\nname = \"other\"\n", "t.toml:2: tenant \"other\": the name \"other\" is reserved"),
            ("[[tenant]]\nname = \"a\"\n[[tenant]]\nname = \"b\"\n[[tenant]]\nname = \"a\"\n", "t.toml:6: tenant \"a\": the name is already used on line 2"),
            (&format!("[[tenant]]\nname = \"default\"\nkeys = [\n  \"{a}\",\n]\n"), "t.toml:4: tenant \"default\": the default tenant (requests with no key or an unknown one) cannot have keys"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{a}\",\n\"sk-live-secret\"]\n"), "t.toml:4: tenant \"x\": key 2 is not \"sha256:\" and 64 hex digits"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{}\"]\n", &a[..a.len() - 1]), "t.toml:3: tenant \"x\": key 1 is not"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{}g\"]\n", &a[..a.len() - 1]), "t.toml:3: tenant \"x\": key 1 is not"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{}\"]\n", a.replace("sha256", "SHA256")), "t.toml:3: tenant \"x\": key 1 is not"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{a}\"]\n[[tenant]]\nname = \"y\"\nkeys = [\"{b}\", \"{upper_a}\"]\n"), "t.toml:6: tenant \"y\": key 2 is already a key of tenant \"x\" (line 3)"),
            (&format!("[[tenant]]\nname = \"x\"\nkeys = [\"{a}\", \"{a}\"]\n"), "t.toml:3: tenant \"x\": key 2 is already a key of tenant \"x\" (line 3)"),
            ("[[tenant]]\nname = \"x\"\nmax_class = \"urgent\"\n", "t.toml:3: tenant \"x\": max_class must be critical, standard or sheddable, not \"urgent\""),
            ("[[tenant]]\nname = \"x\"\nmax_waiting = 0\n", "t.toml:3: tenant \"x\": max_waiting must be at least 1, not 0"),
            ("[[tenant]]\nname = \"x\"\n\nmax_tokens = -5\n", "t.toml:4: tenant \"x\": max_tokens must be at least 1, not -5"),
            ("[[tenant]]\nname = \"x\"\nwieght = 3\n", "t.toml:3: unknown field `wieght`, expected one of `name`, `keys`, `weight`"),
            ("[[tenant]]\nname = \"x\"\n[[tenants]]\nname = \"y\"\n", "t.toml:3: unknown field `tenants`, expected `tenant`"),
            ("[[tenant]]\nname = \"x\"\nweight = \"10\"\n", "t.toml:3: invalid type: a string, expected i64"),
            ("[[tenant]]\nname = \"x\"\nweight = 1.5\n", "t.toml:3: invalid type: floating point `1.5`, expected i64"),
            ("[[tenant]]\nname = \"x\"\nweight = = 3\n", "t.toml:3: "),
            ("[[tenant]]\nname = \"x\"\n\n[[tenant]]\nweight = 3\n", "t.toml:4: missing field `name`"),
        ];
        for (text, expected) in cases {
            let error = toml_error(text);
            assert!(error.starts_with(expected), "{text:?}:\n  got      {error}\n  expected {expected}");
        }
        assert!(
            !toml_error("[[tenant]]\nname = \"x\"\nkeys = [\"sk-live-secret\"]\n").contains("sk-live"),
            "never echoed"
        );
        let long = "n".repeat(100);
        let error = toml_error(&format!("[[tenant]]\nname = \"{long}\"\n"));
        assert!(error.starts_with(&format!("t.toml:2: tenant \"{}\"…: a name", &long[..64])), "{error}");
    }

    #[test]
    fn json_errors_name_the_line() {
        let a = hash_key("key-a");
        let cases = [
            ("{\"tenant\": [\n  {\"name\": \"acme\",\n   \"weight\": 0}\n]}", "t.json:3: tenant \"acme\": weight must be 1..=1000, not 0"),
            ("{\"tenant\": [\n  {\"name\": \"a\"},\n  {\n \"name\": \"a\"}\n]}", "t.json:4: tenant \"a\": the name is already used on line 2"),
            (&format!("{{\"tenant\": [\n{{\"name\": \"x\", \"keys\": [\"{a}\"]}},\n{{\"name\": \"y\", \"keys\": [\n\"{a}\"]}}]}}"), "t.json:4: tenant \"y\": key 1 is already a key of tenant \"x\" (line 2)"),
            ("{\"tenant\": [{\"name\": \"default\",\n \"keys\": [\"sha256:00\"]}]}", "t.json:2: tenant \"default\": the default tenant"),
            ("{\"tenant\": [{\"name\": \"x\"},\n{\"max_class\": \"top\",\n \"name\": \"y\"}]}", "t.json:2: tenant \"y\": max_class must be"),
            ("{\"tenant\": [{\"name\": \"x\"},\n{\"name\": \"Y\\\"]}\"}]}", "t.json:2: tenant \"Y\\\"]}\": a name is"),
            ("{\"tenant\": [{\"name\": \"x\"},\n{\"name\": \"y\",\n \"wieght\": 2}]}", "t.json:3: unknown field `wieght`, expected one of"),
            ("{\"tenant\": [{\"name\": \"x\",\n \"weight\": 2.5}]}", "t.json:2: invalid type: floating point `2.5`, expected i64"),
            ("{\"tenant\": [{\"name\": \"x\"},\n]}", "t.json:2: "),
            ("{\"tenants\": []}", "t.json:1: unknown field `tenants`, expected `tenant`"),
        ];
        for (text, expected) in cases {
            let error = json_error(text);
            assert!(error.starts_with(expected), "{text:?}:\n  got      {error}\n  expected {expected}");
            assert!(!error.contains("column"), "{error}");
        }
    }

    #[test]
    fn at_most_a_thousand_tenants() {
        let text = |count: usize| (0..count).map(|i| format!("[[tenant]]\nname = \"t{i}\"\n")).collect::<String>();
        assert_eq!(parse(&text(MAX_TENANTS), false, "t.toml").unwrap().len(), MAX_TENANTS + 1);
        assert_eq!(toml_error(&text(MAX_TENANTS + 1)), "t.toml:2002: more than 1000 tenants");
    }

    #[test]
    fn files_over_a_mebibyte_are_refused_unread() {
        let path =
            std::env::temp_dir().join(format!("loadgate-tenants-{}-{}.toml", std::process::id(), fastrand::u64(..)));
        let limit = usize::try_from(MAX_FILE_BYTES).unwrap();
        std::fs::write(&path, "#".repeat(limit)).unwrap();
        assert_eq!(read(&path).map(|text| text.len()), Ok(limit), "1 MiB exactly is fine");
        std::fs::write(&path, "#".repeat(limit + 1)).unwrap();
        let error = read(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert_eq!(error, format!("{}: the file is 1048577 bytes, more than 1048576 (1 MiB)", path.display()));
        assert!(read(&path).unwrap_err().contains("cannot open"));
    }

    #[test]
    fn key_hashes_are_64_hex_digits() {
        let hex = &hash_key("k")["sha256:".len()..];
        assert!(key_hash(&format!("sha256:{hex}")).is_some());
        assert_eq!(key_hash(&format!("sha256:{}", hex.to_uppercase())), key_hash(&format!("sha256:{hex}")));
        for bad in [format!("sha256:+{}", &hex[1..]), format!("sha256:{hex}0"), hex.to_owned(), format!("sha1:{hex}")] {
            assert!(key_hash(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn lines_of_offsets() {
        let text = "a\nbc\n\nd";
        assert_eq!([0, 1, 2, 4, 5, 6, 7, 100].map(|at| line_of(text, at)), [1, 1, 2, 2, 3, 4, 4, 4]);
        assert_eq!(line_of("", 0), 1);
    }
}
