//! OpenAI-compatible HTTP server over the engine's public API.
