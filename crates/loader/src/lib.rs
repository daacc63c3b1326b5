//! Model files and what comes with them: GGUF and safetensors readers,
//! tokenizers, chat templates and model-source resolution.

pub mod chat_template;
pub mod gguf;
pub mod safetensors;
pub mod source;
#[cfg(test)]
mod test_dir;
pub mod tokenizer;
