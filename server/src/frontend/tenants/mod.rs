//! [`Tenants`]: who sends a request, from the API key it presents, and what
//! that tenant may use. Loaded from a tenants file (a regular file: TOML,
//! or JSON when the path ends in `.json`; at most 1 MiB and 1,000
//! tenants), validated at load, and swapped on SIGHUP ([`SharedTenants`]).
//!
//! ```toml
//! [[tenant]]
//! name = "acme"                  # a-z 0-9 _ -, 1 to 64, unique; "other" is reserved
//! keys = ["sha256:<64 hex>"]     # SHA-256 of each API key (hash_key); a hash once per file
//! weight = 10                    # 1..=1000, default 1
//! max_class = "critical"         # critical | standard | sheddable, default standard
//! max_waiting = 100              # optional, >= 1: this tenant's waiting requests
//! max_tokens = 200000            # optional, >= 1: this tenant's queued prompt tokens
//! ```
//!
//! JSON: `{"tenant": [{"name": "acme", ...}]}`. Unknown fields are errors,
//! and every error names the file and line (`tenants.toml:7: tenant
//! "acme": weight must be 1..=1000, not 0`). A tenant named `default`
//! (without keys) configures the requests with no key or an unknown one;
//! without it, an implicit `default` has weight 1, `standard` and no caps.
//!
//! Indices are small and stable for one file: 0 is the default tenant, the
//! file's other tenants follow from 1 in file order. The waiting line knows
//! a tenant by its *line id* instead, which stays with its name across
//! reloads ([`Tenants::line_id`]): a reload that inserts or reorders
//! tenants does not hand the waiters already in line, or their caps, to
//! another tenant.

mod file;
mod redact;
mod tenant;

pub(crate) use tenant::Tenant;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use axum::http::{header, HeaderMap};
use sha2::{Digest as _, Sha256};

/// The longest bearer key read ([`bearer`]).
pub(crate) const MAX_KEY_LEN: usize = 4096;

/// A validated tenants file: the default tenant at index 0, then the
/// file's others in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tenants {
    tenants: Vec<Tenant>,
    /// Every key hash with its tenant's index ([`Tenants::by_key`]).
    keys: HashMap<[u8; 32], u32>,
    /// Every name with its tenant's index ([`Tenants::by_name`]).
    names: HashMap<String, u32>,
    /// Each tenant's line id, by index ([`Tenants::line_id`]).
    line_ids: Vec<u32>,
    /// The line id the next new name gets (ids are never reused).
    next_line_id: u32,
}

impl Tenants {
    fn new(tenants: Vec<Tenant>) -> Tenants {
        let keys = (0..).zip(&tenants).flat_map(|(index, t)| t.keys.iter().map(move |&hash| (hash, index)));
        let keys = keys.collect();
        let names = (0..).zip(&tenants).map(|(index, t)| (t.name.clone(), index)).collect();
        let line_ids = (0..).take(tenants.len()).collect();
        let next_line_id = u32::try_from(tenants.len()).expect("at most 1,001 tenants");
        Tenants { tenants, keys, names, line_ids, next_line_id }
    }

    /// These tenants with the line ids of `before` (the file they replace)
    /// kept for the names it had: a new name gets an id no name had.
    fn succeeding(mut self, before: &Tenants) -> Tenants {
        let mut next = before.next_line_id;
        for (tenant, id) in self.tenants.iter().zip(&mut self.line_ids) {
            *id = match before.by_name(&tenant.name) {
                Some((index, _)) => before.line_id(index),
                None => {
                    let fresh = next;
                    // Past u32::MAX new names (about four billion): the
                    // last id is shared, the line's only cost.
                    next = next.saturating_add(1);
                    fresh
                }
            };
        }
        self.next_line_id = next;
        self
    }

    /// The waiting line's id of the tenant at `index`: the same for a name
    /// as long as the process runs (0 for `default`).
    pub(crate) fn line_id(&self, index: u32) -> u32 {
        usize::try_from(index).ok().and_then(|i| self.line_ids.get(i).copied()).unwrap_or(index)
    }

    /// Reads, parses and validates the file at `path` (JSON if it ends in
    /// `.json`, TOML otherwise).
    ///
    /// # Errors
    ///
    /// An unreadable file, one that is not a regular file (a pipe, a
    /// device, a directory), one over 1 MiB, or any error of
    /// [`Tenants::parse`]; the text starts with the path.
    pub(crate) fn load(path: &Path) -> Result<Tenants, String> {
        // A pipe would be read again empty on SIGHUP (a file with no
        // tenants), a FIFO's open would wait for a writer: not opened.
        if std::fs::metadata(path).is_ok_and(|meta| !meta.is_file()) {
            return Err(format!("{}: not a regular file (it is read again on each SIGHUP)", path.display()));
        }
        let text = file::read(path)?;
        let json = path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        Tenants::parse(&text, json, &path.display().to_string())
    }

    /// Parses and validates `text` (JSON when `json`), `origin` naming it
    /// in errors.
    ///
    /// # Errors
    ///
    /// `origin:line: what` for a syntax error, a value of the wrong type, an
    /// unknown field or a rule of the format broken.
    pub(crate) fn parse(text: &str, json: bool, origin: &str) -> Result<Tenants, String> {
        file::parse(text, json, origin).map(Tenants::new)
    }

    /// The tenant holding `key` (a bearer key as presented), with its
    /// index: its SHA-256 looked up among the stored hashes, at a cost that
    /// does not grow with the file (a scan of every hash in constant time
    /// cost 28 µs a request with 1,000 keys). The lookup's time may depend
    /// on the digest, which the caller picks through the key, and says at
    /// most whether that digest is stored: a stored digest alone is no key
    /// (SHA-256 has no known preimage attack), and the file's keys are the
    /// operator's random secrets.
    pub(crate) fn by_key(&self, key: &str) -> Option<(u32, &Tenant)> {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let index = *self.keys.get(&hash)?;
        Some((index, self.get(index)?))
    }

    /// The tenant named `name`, with its index.
    pub(crate) fn by_name(&self, name: &str) -> Option<(u32, &Tenant)> {
        let index = *self.names.get(name)?;
        Some((index, self.get(index)?))
    }

    /// The tenant of requests with no key or an unknown one (index 0).
    pub(crate) fn default_tenant(&self) -> (u32, &Tenant) {
        (0, &self.tenants[0])
    }

    /// The tenant at `index`.
    #[inline]
    pub(crate) fn get(&self, index: u32) -> Option<&Tenant> {
        self.tenants.get(usize::try_from(index).ok()?)
    }

    /// How many tenants, the default included.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.tenants.len()
    }
}

/// `sha256:<64 lowercase hex>`: how the file stores `key`.
pub(crate) fn hash_key(key: &str) -> String {
    format!("sha256:{}", crate::secret::to_hex(&Sha256::digest(key.as_bytes())))
}

/// The key of the one `Authorization: Bearer <key>` header (scheme
/// case-insensitive, key without spaces and at most [`MAX_KEY_LEN`] bytes);
/// `None` for no such header, several, or another scheme.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else { return None };
    let (scheme, key) = value.to_str().ok()?.split_once(' ')?;
    let key = key.trim_ascii();
    let well_formed = !key.is_empty() && key.len() <= MAX_KEY_LEN && !key.contains([' ', '\t']);
    (scheme.eq_ignore_ascii_case("bearer") && well_formed).then_some(key)
}

/// Why no request can present `key` as `Authorization: Bearer <key>` (so
/// its hash would never match: [`bearer`] trims or refuses it), if so.
pub(crate) fn unpresentable(key: &str) -> Option<String> {
    if key.len() > MAX_KEY_LEN {
        return Some(format!("it is longer than {MAX_KEY_LEN} bytes"));
    }
    // A header value is visible ASCII; a space or tab ends the key.
    let visible = !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic());
    (!visible).then(|| "it is empty or has a space, a tab or a character outside visible ASCII".to_owned())
}

/// The current [`Tenants`], replaced whole by [`SharedTenants::reload`],
/// and the names reloads took away.
///
/// A lock, not `arc_swap`: this crate does not depend on arc-swap, and a
/// read is one uncontended read lock and an `Arc` clone per request.
#[derive(Debug)]
pub(crate) struct SharedTenants {
    current: RwLock<Arc<Tenants>>,
    /// Names of earlier files that the current one lacks, latest last, at
    /// most [`file::MAX_TENANTS`]: their metric series end
    /// ([`SharedTenants::retired`]).
    retired: Mutex<Vec<String>>,
}

impl SharedTenants {
    /// Starts with `tenants`.
    pub(crate) fn new(tenants: Tenants) -> SharedTenants {
        SharedTenants { current: RwLock::new(Arc::new(tenants)), retired: Mutex::default() }
    }

    /// The current tenants.
    pub(crate) fn load(&self) -> Arc<Tenants> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The names earlier files had and the current one lacks (the latest
    /// [`file::MAX_TENANTS`]): `/metrics` drops their series, which a request
    /// that began before the reload may have made again.
    pub(crate) fn retired(&self) -> Vec<String> {
        self.retired.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Loads `path` in place of the current tenants; returns how many
    /// tenants it has (the default included).
    ///
    /// # Errors
    ///
    /// As [`Tenants::load`]; the current tenants stay.
    pub(crate) fn reload(&self, path: &Path) -> Result<usize, String> {
        let tenants = Tenants::load(path)?;
        let count = tenants.len();
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        retired.retain(|name| tenants.by_name(name).is_none());
        let gone: Vec<String> = (current.tenants.iter())
            .filter(|t| tenants.by_name(&t.name).is_none() && !retired.contains(&t.name))
            .map(|t| t.name.clone())
            .collect();
        retired.extend(gone);
        let excess = retired.len().saturating_sub(file::MAX_TENANTS);
        retired.drain(..excess);
        *current = Arc::new(tenants.succeeding(&current));
        Ok(count)
    }
}

/// Reloads `path` into `shared` on each SIGHUP, logging the outcome. The
/// signal is watched before this returns.
///
/// # Errors
///
/// SIGHUP cannot be watched.
#[cfg(unix)]
pub(crate) fn spawn_reload_on_sighup(
    shared: Arc<SharedTenants>,
    path: PathBuf,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let (shared, file) = (shared.clone(), path.clone());
            // Reading and parsing up to 1 MiB: off the async workers.
            match tokio::task::spawn_blocking(move || shared.reload(&file)).await {
                Ok(Ok(tenants)) => tracing::info!(tenants, path = %path.display(), "tenants file reloaded"),
                Ok(Err(error)) => tracing::warn!(%error, "tenants file not reloaded, keeping the previous file"),
                Err(error) => tracing::warn!(%error, "tenants reload failed, keeping the previous file"),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(keys: &[(&str, &[&str])]) -> String {
        let entries = keys.iter().map(|(name, keys)| {
            let hashes: Vec<_> = keys.iter().map(|k| format!("{:?}", hash_key(k))).collect();
            format!("[[tenant]]\nname = \"{name}\"\nkeys = [{}]\n", hashes.join(", "))
        });
        entries.collect()
    }

    #[test]
    fn keys_find_their_tenant() {
        let text = file(&[("acme", &["acme-1", "acme-2"]), ("beta", &["beta-1"]), ("gamma", &[])]);
        let tenants = Tenants::parse(&text, false, "t.toml").unwrap();
        assert_eq!(tenants.len(), 4);
        let name = |found: Option<(u32, &Tenant)>| found.map(|(index, t)| (index, t.name.clone()));
        assert_eq!(name(tenants.by_key("acme-1")), Some((1, "acme".into())));
        assert_eq!(name(tenants.by_key("acme-2")), Some((1, "acme".into())));
        assert_eq!(name(tenants.by_key("beta-1")), Some((2, "beta".into())));
        for wrong in ["acme-3", "", "ACME-1", "acme-1 ", &hash_key("acme-1")] {
            assert!(tenants.by_key(wrong).is_none(), "{wrong:?}");
        }
        assert_eq!(name(tenants.by_name("gamma")), Some((3, "gamma".into())));
        assert_eq!(name(tenants.by_name("default")), Some((0, "default".into())));
        assert!(tenants.by_name("delta").is_none());
        assert_eq!(tenants.get(2).map(|t| t.name.as_str()), Some("beta"));
        assert!(tenants.get(4).is_none() && tenants.get(u32::MAX).is_none());
        assert!(!format!("{tenants:?}").contains(&hash_key("acme-1")[7..]), "hashes stay out of logs");
    }

    #[test]
    fn a_name_keeps_its_line_id_across_reloads() {
        let parse = |names: &[&str]| {
            let entries: Vec<(&str, &[&str])> = names.iter().map(|n| (*n, &[][..])).collect();
            Tenants::parse(&file(&entries), false, "t.toml").unwrap()
        };
        let ids = |t: &Tenants| -> Vec<(String, u32)> {
            (0..t.len() as u32).map(|i| (t.get(i).unwrap().name.clone(), t.line_id(i))).collect()
        };
        let first = parse(&["a", "b"]);
        assert_eq!(ids(&first), [("default".into(), 0), ("a".into(), 1), ("b".into(), 2)]);
        // `c` inserted before `a`, `b` gone: `a` keeps 1, `c` gets an id no
        // name had.
        let second = parse(&["c", "a"]).succeeding(&first);
        assert_eq!(ids(&second), [("default".into(), 0), ("c".into(), 3), ("a".into(), 1)]);
        // `b` back: not its old id (it may still label waiters of the old
        // `b`, whose caps were the old file's).
        let third = parse(&["b", "a", "c"]).succeeding(&second);
        assert_eq!(ids(&third), [("default".into(), 0), ("b".into(), 4), ("a".into(), 1), ("c".into(), 3)]);
        assert_eq!(third.line_id(99), 99, "an index past the file is its own id");
    }

    #[test]
    fn the_default_tenant_is_explicit_or_implicit() {
        let implicit = Tenants::parse(&file(&[("acme", &["k"])]), false, "t.toml").unwrap();
        assert_eq!(implicit.default_tenant(), (0, &Tenant::implicit_default()));
        let text =
            format!("{}[[tenant]]\nname = \"default\"\nweight = 5\nmax_waiting = 3\n", file(&[("acme", &["k"])]));
        let explicit = Tenants::parse(&text, false, "t.toml").unwrap();
        let (index, default) = explicit.default_tenant();
        assert_eq!((index, default.name.as_str(), default.weight, default.max_waiting), (0, "default", 5, Some(3)));
        assert_eq!(explicit.len(), 2);
        assert_eq!(explicit.by_name("acme").map(|(index, _)| index), Some(1), "the file's others from 1");
        assert_eq!(explicit.by_key("k").map(|(index, _)| index), Some(1));
        assert!(explicit.by_key("unknown").is_none(), "the caller falls back to default_tenant");
    }

    #[test]
    fn hash_key_is_the_stored_form() {
        // SHA-256("test"), the example of the format.
        assert_eq!(hash_key("test"), "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    }

    #[test]
    fn bearer_takes_one_well_formed_header() {
        let headers = |values: &[&str]| {
            let mut map = HeaderMap::new();
            for v in values {
                map.append(header::AUTHORIZATION, v.parse().unwrap());
            }
            map
        };
        assert_eq!(bearer(&headers(&["Bearer sk-1"])), Some("sk-1"));
        assert_eq!(bearer(&headers(&["bEaReR   sk-1 "])), Some("sk-1"));
        let longest = format!("Bearer {}", "k".repeat(MAX_KEY_LEN));
        assert_eq!(bearer(&headers(&[&longest])).map(str::len), Some(MAX_KEY_LEN));
        let too_long = format!("Bearer {}", "k".repeat(MAX_KEY_LEN + 1));
        // What `unpresentable` lets through is what `bearer` returns.
        for key in ["sk-1", "a~!", &"k".repeat(MAX_KEY_LEN)] {
            assert_eq!(unpresentable(key), None, "{key}");
            assert_eq!(bearer(&headers(&[&format!("Bearer {key}")])), Some(key));
        }
        for key in ["", "sk-1 ", " sk-1", "a b", "a\tb", "cl\u{e9}", &"k".repeat(MAX_KEY_LEN + 1)] {
            assert!(unpresentable(key).is_some(), "{key:?}");
        }
        for refused in [
            &[][..],
            &["Bearer sk-1", "Bearer sk-1"],
            &["Basic sk-1"],
            &["Bearer"],
            &["Bearer  "],
            &["sk-1"],
            &["Bearer a b"],
            &[&too_long],
        ] {
            assert_eq!(bearer(&headers(refused)), None, "{refused:?}");
        }
    }

    /// Found by a review: a JSON file that is not an object was read as
    /// serde's sequence form of one (`[]`: no tenants, every key then
    /// `default`'s), or refused naming this crate's types (`expected struct
    /// RawFile`, `RawEntry`) instead of the format.
    #[test]
    fn a_file_of_the_wrong_shape_is_refused_naming_the_right_one() {
        for text in ["[]", "[{\"name\": \"a\"}]", "null", "\n 5"] {
            let error = Tenants::parse(text, true, "t.json").unwrap_err();
            assert!(error.contains(r#"{"tenant": ["#), "{text:?}: {error}");
        }
        // A byte order mark (as some editors write) is no other shape.
        assert_eq!(Tenants::parse("\u{feff}{\"tenant\": [{\"name\": \"a\"}]}", true, "t.json").map(|t| t.len()), Ok(2));
        let errors = [
            Tenants::parse(r#"{"tenant": [5]}"#, true, "t.json").unwrap_err(),
            Tenants::parse("tenant = [5]\n", false, "t.toml").unwrap_err(),
        ];
        for error in errors {
            assert!(!error.contains("Raw") && error.contains("a tenant"), "{error}");
        }
    }

    /// Found by a review: an API key pasted where its list of hashes
    /// belongs was refused with the parser's message, which quotes the
    /// value (`invalid type: string "sk-live-…", expected a sequence`), and
    /// that message is logged at start and on each SIGHUP.
    #[test]
    fn a_key_pasted_for_its_list_is_not_echoed() {
        let toml = Tenants::parse("[[tenant]]\nname = \"a\"\nkeys = \"sk-live-pasted\"\n", false, "t.toml");
        let json = Tenants::parse("{\"tenant\": [{\"name\": \"a\",\n \"keys\": \"sk-live-pasted\"}]}", true, "t.json");
        for (error, line) in [(toml.unwrap_err(), "t.toml:3: "), (json.unwrap_err(), "t.json:2: ")] {
            assert!(!error.contains("sk-live-pasted"), "the key is in the message: {error}");
            assert!(error.starts_with(line) && error.contains("expected a sequence"), "{error}");
        }
    }

    /// A file in the temp directory, removed on drop.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(ext: &str) -> TempFile {
            let name = format!("loadgate-tenants-{}-{}.{ext}", std::process::id(), fastrand::u64(..));
            TempFile(std::env::temp_dir().join(name))
        }

        fn write(&self, text: &str) {
            std::fs::write(&self.0, text).unwrap();
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn reload_keeps_the_old_tenants_on_error() {
        let path = TempFile::new("json");
        path.write(r#"{"tenant": [{"name": "a", "keys": ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]}]}"#);
        let shared = SharedTenants::new(Tenants::load(&path.0).unwrap());
        assert_eq!(shared.load().by_key("test").map(|(_, t)| t.name.clone()), Some("a".into()));
        path.write(r#"{"tenant": [{"name": "a"}, {"name": "b"}]}"#);
        assert_eq!(shared.reload(&path.0), Ok(3));
        assert!(shared.load().by_key("test").is_none());
        path.write("{\"tenant\": [{\"name\": \"a\"},\n {\"name\": \"a\"}]}");
        let error = shared.reload(&path.0).unwrap_err();
        assert_eq!(error, format!("{}:2: tenant \"a\": the name is already used on line 1", path.0.display()));
        assert_eq!(shared.load().len(), 3, "the previous file stays");
    }

    /// Found by a review: a tenants file that is a pipe (`--tenants-file
    /// <(make-tenants)`) loaded at start, and a SIGHUP then read it again
    /// empty: a valid file with no tenants, which replaced them all (every
    /// key then `default`'s).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_pipe_is_refused_rather_than_read_empty_on_a_reload() {
        use std::io::Write as _;
        use std::os::fd::AsRawFd as _;
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(file(&[("acme", &["k"])]).as_bytes()).unwrap();
        drop(writer);
        let pipe = PathBuf::from(format!("/proc/self/fd/{}", reader.as_raw_fd()));
        let regular = TempFile::new("toml");
        regular.write(&file(&[("acme", &["k"])]));
        let shared = SharedTenants::new(Tenants::load(&regular.0).unwrap());
        let first = Tenants::load(&pipe).map(|t| t.len());
        let again = shared.reload(&pipe);
        assert!(first.is_err() && again.is_err(), "read {first:?}, then {again:?} tenants");
        assert!(again.unwrap_err().contains("not a regular file"));
        assert!(shared.load().by_key("k").is_some(), "the tenants stay");
    }

    #[test]
    fn reloads_retire_the_names_they_take_away_until_one_brings_them_back() {
        let path = TempFile::new("toml");
        let names = |names: &[&str]| file(&names.iter().map(|n| (*n, &[][..])).collect::<Vec<_>>());
        path.write(&names(&["a", "b", "c"]));
        let shared = SharedTenants::new(Tenants::load(&path.0).unwrap());
        assert!(shared.retired().is_empty());
        path.write(&names(&["a", "b2"]));
        shared.reload(&path.0).unwrap();
        assert_eq!(shared.retired(), ["b", "c"]);
        path.write(&names(&["c", "b3"]));
        shared.reload(&path.0).unwrap();
        assert_eq!(shared.retired(), ["b", "a", "b2"], "c is back; a and b2 go, b stays gone");
        // A thousand renames more: the latest thousand names are kept.
        for round in 0..2 {
            let many: Vec<String> = (0..file::MAX_TENANTS).map(|i| format!("t{round}-{i}")).collect();
            path.write(&names(&many.iter().map(String::as_str).collect::<Vec<_>>()));
            shared.reload(&path.0).unwrap();
        }
        let retired = shared.retired();
        assert_eq!(retired.len(), file::MAX_TENANTS);
        assert_eq!(
            (retired[0].as_str(), retired[retired.len() - 1].as_str()),
            ("t0-0", "t0-999"),
            "the oldest go first"
        );
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn sighup_reloads() {
        let path = TempFile::new("toml");
        path.write("");
        let shared = Arc::new(SharedTenants::new(Tenants::load(&path.0).unwrap()));
        let task = spawn_reload_on_sighup(shared.clone(), path.0.clone()).unwrap();
        path.write(&file(&[("acme", &["k"])]));
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::HUP).unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while shared.load().len() != 2 {
            assert!(tokio::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        task.abort();
    }
}
