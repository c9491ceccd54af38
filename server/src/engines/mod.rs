//! Real inference engines (vLLM, SGLang, llama.cpp) as upstreams: how one
//! is named on the command line (`spec.rs`), scraping its load
//! (`scrape.rs`, mapped by the library's `loadgate::engines`), the models
//! it serves (`models.rs`), the bounded `GET` they share (`fetch.rs`), and
//! llama.cpp's non-streamed requests sent as streams and answered whole
//! (`assemble.rs`). The frontend's `--engine` and the worker sidecar both
//! build on these.

pub mod assemble;
mod fetch;
pub mod models;
pub mod scrape;
pub mod spec;
