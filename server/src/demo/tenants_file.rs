//! The frontend's tenants file for `demo --tenants`: every tenant of the
//! mix with weight 1 and its name as its one API key (stored hashed, as
//! the frontend wants it). One per demo process, in the temp dir with the
//! pid in its name ([`path`]), so [`Mode::Tenants`] stays `Copy`; removed
//! when its [`TenantsFile`] drops, on an error too.
//!
//! [`Mode::Tenants`]: crate::demo::modes::Mode::Tenants

use std::fs;
use std::io::{ErrorKind, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::frontend::tenants::hash_key;

/// Where this process's tenants file goes.
pub(crate) fn path() -> PathBuf {
    std::env::temp_dir().join(format!("loadgate-demo-tenants-{}.toml", std::process::id()))
}

/// The file's TOML: each of `names` with weight 1 and its name as its key.
pub(crate) fn text(names: &[String]) -> String {
    names
        .iter()
        .map(|name| format!("[[tenant]]\nname = \"{name}\"\nkeys = [\"{}\"]\nweight = 1\n", hash_key(name)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The written tenants file, removed when dropped.
#[derive(Debug)]
pub(crate) struct TenantsFile {
    path: PathBuf,
}

impl TenantsFile {
    /// Writes the file of `names` at [`path`].
    ///
    /// # Errors
    ///
    /// The file cannot be created or written.
    pub(crate) fn write(names: &[String]) -> anyhow::Result<TenantsFile> {
        TenantsFile::write_at(path(), &text(names))
    }

    /// Writes `text` at `path`, replacing a file a former process of the
    /// same pid left; a new file, never through a link someone put there.
    fn write_at(path: PathBuf, text: &str) -> anyhow::Result<TenantsFile> {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot replace {}", path.display()));
            }
            _ => {}
        }
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        // The guard first: a failed write still removes the file.
        let written = TenantsFile { path };
        file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", written.path.display()))?;
        Ok(written)
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TenantsFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::tenants::Tenants;

    #[test]
    fn each_tenant_is_found_by_its_name_as_key_with_weight_1() {
        let names = ["big".to_owned(), "small".to_owned()];
        let tenants = Tenants::parse(&text(&names), false, "t.toml").unwrap();
        for name in &names {
            let (_, tenant) = tenants.by_key(name).unwrap();
            assert_eq!((tenant.name.as_str(), tenant.weight), (name.as_str(), 1));
        }
        assert!(tenants.by_key("nobody").is_none());
        assert!(path().to_string_lossy().contains(&std::process::id().to_string()));
    }

    #[test]
    fn the_file_is_there_while_the_guard_lives() {
        let at = std::env::temp_dir().join(format!("loadgate-demo-tenants-test-{}.toml", std::process::id()));
        fs::write(&at, "stale").unwrap();
        let file = TenantsFile::write_at(at.clone(), "[[tenant]]\nname = \"a\"\n").unwrap();
        assert_eq!(file.path(), at);
        assert_eq!(fs::read_to_string(&at).unwrap(), "[[tenant]]\nname = \"a\"\n", "the stale one replaced");
        drop(file);
        assert!(!at.exists());
    }
}
