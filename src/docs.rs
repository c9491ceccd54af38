//! Background reading, rendered from the repository's `docs/` folder (the
//! same files, readable on the forge too). Every Markdown file there has a
//! module here; a test checks that none is missing.

#[doc = include_str!("../docs/architecture.md")]
pub mod architecture {}

#[doc = include_str!("../docs/semantics.md")]
pub mod semantics {}

#[doc = include_str!("../docs/benchmarks.md")]
pub mod benchmarks {}

#[doc = include_str!("../docs/deployment.md")]
pub mod deployment {}

#[doc = include_str!("../docs/engines.md")]
pub mod engines {}

#[doc = include_str!("../docs/reliability.md")]
pub mod reliability {}

#[doc = include_str!("../docs/demo.md")]
pub mod demo {}

#[doc = include_str!("../docs/dynamo.md")]
pub mod dynamo {}

#[cfg(test)]
mod tests {
    /// Every `docs/*.md` has its `include_str!` above.
    #[test]
    fn every_doc_is_rendered() {
        let this = include_str!("docs.rs");
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(dir).expect("the docs folder") {
            let name = entry.expect("a docs entry").file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") && !this.contains(&format!("\"../docs/{name}\"")) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "docs not rendered by src/docs.rs: {missing:?}");
    }
}
