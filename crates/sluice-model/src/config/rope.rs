//! Rotary embedding parameters: `rope_parameters` (transformers 5) or `rope_theta` +
//! `rope_scaling` (older configs).

use super::reader::Cfg;
use super::{RopeConfig, RopeScaling};
use crate::ModelError;

/// transformers' `yarn_get_mscale`.
pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Reads rope parameters from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`
/// (older configs). Returns the config and, for YaRN with `mscale_all_dim`, (factor, mscale_all_dim).
pub(crate) fn read_rope(
    c: &Cfg<'_>,
    dim: usize,
    interleaved: bool,
    max_positions: usize,
) -> Result<(RopeConfig, Option<(f64, f64)>), ModelError> {
    let (params, prefix) = match c.get("rope_parameters") {
        Some(p) => (Some(p), "rope_parameters."),
        None => (c.get("rope_scaling"), "rope_scaling."),
    };
    let p = params.map(|v| Cfg {
        v,
        file: c.file,
        prefix: prefix.to_owned(),
    });
    let theta = match p.as_ref().and_then(|p| p.get("rope_theta")) {
        Some(_) => p
            .as_ref()
            .map(|p| p.f64("rope_theta"))
            .transpose()?
            .unwrap_or(0.0),
        None => c.f64("rope_theta")?,
    };
    if theta <= 0.0 {
        return Err(c.err("rope_theta", "must be positive"));
    }
    let Some(p) = p else {
        return Ok((
            RopeConfig {
                theta,
                dim,
                interleaved,
                scaling: RopeScaling::None,
            },
            None,
        ));
    };
    if !p.v.is_object() {
        return Err(c.err(prefix.trim_end_matches('.'), "expected an object"));
    }
    let ty = match (p.get("rope_type"), p.get("type")) {
        (Some(_), _) => p.str("rope_type")?,
        (None, Some(_)) => p.str("type")?,
        (None, None) => "default",
    };
    if let Some(f) = p.opt_f64("partial_rotary_factor")?
        && f != 1.0
    {
        return Err(p.err(
            "partial_rotary_factor",
            format!("{f} is not supported (only 1.0)"),
        ));
    }
    let mut extra = None;
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: p.f64("factor")?,
        },
        "yarn" => {
            let factor = p.f64("factor")?;
            let original = match p.opt_f64("original_max_position_embeddings")? {
                Some(o) => o,
                // transformers: falls back to max_position_embeddings.
                None => max_positions as f64,
            };
            let mscale = p.opt_f64("mscale")?;
            let mscale_all_dim = p.opt_f64("mscale_all_dim")?;
            if let Some(all) = mscale_all_dim
                && all != 0.0
            {
                extra = Some((factor, all));
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                // transformers: `or 32` / `or 1` (a zero counts as absent).
                beta_fast: p
                    .opt_f64("beta_fast")?
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: p.opt_f64("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                attention_factor: p.opt_f64("attention_factor")?,
                mscale,
                mscale_all_dim,
                truncate: p.bool_or("truncate", true)?,
            }
        }
        other => {
            let field = if p.get("rope_type").is_some() {
                "rope_type"
            } else {
                "type"
            };
            return Err(p.err(
                field,
                format!("`{other}` is not supported (supported: default, linear, yarn)"),
            ));
        }
    };
    Ok((
        RopeConfig {
            theta,
            dim,
            interleaved,
            scaling,
        },
        extra,
    ))
}
