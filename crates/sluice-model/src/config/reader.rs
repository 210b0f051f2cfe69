//! A JSON object of `config.json` with the file it came from: typed, strict reads of its
//! fields, each error naming the file and the field (dotted path).

use std::path::Path;

use serde_json::Value;

use super::limit_of;
use crate::ModelError;

/// A JSON object with the file it came from, for error messages.
pub(crate) struct Cfg<'a> {
    pub(crate) v: &'a Value,
    pub(crate) file: &'a Path,
    pub(crate) prefix: String,
}

impl<'a> Cfg<'a> {
    pub(crate) fn err(&self, field: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            file: self.file.to_path_buf(),
            field: format!("{}{field}", self.prefix),
            msg: msg.into(),
        }
    }

    pub(crate) fn get(&self, field: &str) -> Option<&'a Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn req(&self, field: &str) -> Result<&'a Value, ModelError> {
        self.get(field)
            .ok_or_else(|| self.err(field, "required field is missing"))
    }

    /// A size field: a non-negative integer of at most [`MAX_SIZE`] (or the field's own limit
    /// from [`limit_of`]), so nothing proportional to it is allocated before it is checked.
    pub(crate) fn usize(&self, field: &str) -> Result<usize, ModelError> {
        let v = self.req(field)?;
        let n = v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err(field, format!("expected a non-negative integer, got {v}")))?;
        let max = limit_of(field);
        if n > max {
            return Err(self.err(
                field,
                format!("{n} is more than the {max} sluice accepts for this field"),
            ));
        }
        Ok(n)
    }

    pub(crate) fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.usize(field).map(Some),
        }
    }

    pub(crate) fn pos_usize(&self, field: &str) -> Result<usize, ModelError> {
        let n = self.usize(field)?;
        if n == 0 {
            return Err(self.err(field, "must be positive"));
        }
        Ok(n)
    }

    pub(crate) fn f64(&self, field: &str) -> Result<f64, ModelError> {
        let v = self.req(field)?;
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.err(field, format!("expected a number, got {v}")))
    }

    pub(crate) fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.f64(field).map(Some),
        }
    }

    /// A number used as an `f32`: finite as an `f32` too (`1e308` is refused, not made ∞).
    pub(crate) fn f32(&self, field: &str) -> Result<f32, ModelError> {
        let x = self.f64(field)?;
        let y = x as f32;
        if !y.is_finite() {
            return Err(self.err(field, format!("{x} does not fit in a 32-bit float")));
        }
        Ok(y)
    }

    pub(crate) fn opt_f32(&self, field: &str) -> Result<Option<f32>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.f32(field).map(Some),
        }
    }

    /// A positive `f32` (an epsilon, a scaling factor): 0, negative values and values that
    /// underflow to 0 as an `f32` are refused.
    pub(crate) fn pos_f32(&self, field: &str) -> Result<f32, ModelError> {
        let y = self.f32(field)?;
        if y <= 0.0 {
            return Err(self.err(field, format!("{} must be positive", self.f64(field)?)));
        }
        Ok(y)
    }

    pub(crate) fn bool_or(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true or false, got {v}"))),
        }
    }

    pub(crate) fn str(&self, field: &str) -> Result<&'a str, ModelError> {
        let v = self.req(field)?;
        v.as_str()
            .ok_or_else(|| self.err(field, format!("expected a string, got {v}")))
    }

    pub(crate) fn expect_str(
        &self,
        field: &str,
        default: &str,
        allowed: &[&str],
    ) -> Result<(), ModelError> {
        let s = match self.get(field) {
            None => default,
            Some(_) => self.str(field)?,
        };
        if !allowed.contains(&s) {
            return Err(self.err(
                field,
                format!("`{s}` is not supported (supported: {})", allowed.join(", ")),
            ));
        }
        Ok(())
    }

    pub(crate) fn token_ids(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| self.err(field, "expected token ids"))
                })
                .collect(),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(|n| vec![n])
                .ok_or_else(|| self.err(field, format!("expected a token id, got {v}"))),
        }
    }
}
