//! Real inference engines (vLLM, SGLang, llama.cpp) as upstreams: how one
//! is named on the command line (`spec.rs`), scraping its load
//! (`scrape.rs`, mapped by the library's `loadgate::engines`), the models
//! it serves (`models.rs`) and the bounded `GET` they share (`fetch.rs`).
//! The frontend's `--engine` and the worker sidecar both build on these;
//! requests to an engine go through `upstream/`.

mod fetch;

/// An HTTP client error and its sources on one line (scrapes and upstream
/// requests alike).
pub(crate) use self::fetch::chain as error_chain;
pub mod models;
pub mod scrape;
pub mod spec;
