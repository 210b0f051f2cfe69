//! Chat templates: the Jinja `chat_template` of `tokenizer_config.json`, rendered with minijinja
//! the way transformers' `apply_chat_template` renders it (trim_blocks, lstrip_blocks, loop
//! controls, Python string methods, `raise_exception`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or any role the template knows).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    bos_token: String,
    eos_token: String,
    path: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({})", self.path.display())
    }
}

/// A token field of tokenizer_config.json: a string or `{"content": ...}`.
fn token_str(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// Reads the template of a model directory (`tokenizer_config.json`, or a separate
    /// `chat_template.jinja`). `Ok(None)` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, Error> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.exists() {
            Some(sluice_format::read_json(&cfg_path, 64 << 20)?)
        } else {
            None
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = if jinja.exists() {
            let s = std::fs::read_to_string(&jinja).map_err(|e| Error::Io {
                path: jinja.clone(),
                source: e,
            })?;
            (s, jinja)
        } else {
            let Some(t) = cfg.as_ref().and_then(|c| c.get("chat_template")) else {
                return Ok(None);
            };
            let s = match t {
                Value::String(s) => s.clone(),
                // A list of named templates: take "default".
                Value::Array(a) => a
                    .iter()
                    .find(|x| x.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|x| x.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| Error::Template {
                        path: cfg_path.clone(),
                        msg: "no template named `default`".into(),
                    })?
                    .to_owned(),
                _ => {
                    return Err(Error::Template {
                        path: cfg_path,
                        msg: "`chat_template` is not a string".into(),
                    });
                }
            };
            (s, cfg_path)
        };
        let bos = token_str(cfg.as_ref().and_then(|c| c.get("bos_token")));
        let eos = token_str(cfg.as_ref().and_then(|c| c.get("eos_token")));
        ChatTemplate::new(&source, bos, eos, path).map(Some)
    }

    /// Compiles a template.
    pub fn new(
        source: &str,
        bos_token: String,
        eos_token: String,
        path: PathBuf,
    ) -> Result<ChatTemplate, Error> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| Error::Template {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
            path,
        })
    }

    /// Renders messages; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let t = self.env.get_template("chat").map_err(|e| Error::Template {
            path: self.path.clone(),
            msg: e.to_string(),
        })?;
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| Error::Template {
            path: self.path.clone(),
            msg: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_chatml_template() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, "<s>".into(), "</s>".into(), "t".into()).unwrap();
        let out = t
            .render(
                &[
                    Message::new("system", "Be brief."),
                    Message::new("user", " Hi "),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, String::new(), String::new(), "t".into()).unwrap();
        let e = t
            .render(&[Message::new("assistant", "x")], false)
            .unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
        assert_eq!(t.render(&[Message::new("user", "x")], false).unwrap(), "ok");
    }

    #[test]
    fn python_methods_work() {
        let src = "{{ messages[0].content.strip().startswith('a') }}";
        let t = ChatTemplate::new(src, String::new(), String::new(), "t".into()).unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  abc ")], false).unwrap(),
            "True"
        );
    }
}
