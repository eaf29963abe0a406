//! `edgerun serve`: one plan as an HTTP service. The plan is opened, verified and its arena
//! allocated once; jobs wait in a bounded queue and run one at a time on one worker thread
//! ([`queue`]), so memory stays inside the budget under any load. Routes ([`http`]):
//!
//! - `POST /v1/images/generations`: the OpenAI images API (`b64_json` responses);
//! - `POST /sdapi/v1/txt2img`, `GET /sdapi/v1/progress`, `POST /sdapi/v1/interrupt`,
//!   `GET /sdapi/v1/samplers`, `GET /sdapi/v1/sd-models`: AUTOMATIC1111's web UI API;
//! - `GET /v1/models`, `GET /health`, and `GET /`: a page to type a prompt, watch the
//!   progress and see the image.
//!
//! A request gives the same PNG bytes as `edgerun generate` with the same parameters.
//! Without the `server` feature only the request parsers ([`request`]) build: the fuzz
//! targets use them.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
pub mod queue;
pub mod request;

#[cfg(feature = "server")]
pub use http::{serve, ServeConfig};
