//! Rotary embedding parameters: `rope_parameters` (transformers 5) or `rope_theta` +
//! `rope_scaling` (older configs).

use super::reader::Cfg;
use crate::ModelError;
use crate::rope::{RopeConfig, RopeScaling};

/// The rotated dimensions of a head of `dim`: `int(dim × partial_rotary_factor)` as
/// transformers computes it, the factor read from the rope parameters, else the top level,
/// else `partial` (the family's default). A family that rotates whole heads passes `None`,
/// and any factor but 1 is refused.
fn rotary_dim(
    c: &Cfg<'_>,
    p: Option<&Cfg<'_>>,
    dim: usize,
    partial: Option<f64>,
) -> Result<usize, ModelError> {
    let (field, given) = match p.map(|p| p.opt_f64("partial_rotary_factor")).transpose()? {
        Some(Some(f)) => (p.unwrap(), Some(f)),
        _ => (c, c.opt_f64("partial_rotary_factor")?),
    };
    let Some(default) = partial else {
        return match given {
            Some(f) if f != 1.0 => Err(field.err(
                "partial_rotary_factor",
                format!("{f} is not supported (only 1.0)"),
            )),
            _ => Ok(dim),
        };
    };
    let f = given.unwrap_or(default);
    if !(f > 0.0 && f <= 1.0) {
        return Err(field.err("partial_rotary_factor", format!("{f} is not in (0, 1]")));
    }
    let rot = (dim as f64 * f) as usize;
    if rot == 0 || !rot.is_multiple_of(2) {
        return Err(field.err(
            "partial_rotary_factor",
            format!(
                "{f} of head_dim {dim} gives {rot} rotated dimensions, not a positive even number"
            ),
        ));
    }
    Ok(rot)
}

/// Reads rope parameters from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`
/// (older configs), for heads of `dim` of which `partial_rotary_factor` are rotated when
/// `partial` is the family's default factor (see [`rotary_dim`]). Returns the config and, for
/// YaRN with `mscale_all_dim`, (factor, mscale_all_dim).
pub(crate) fn read_rope(
    c: &Cfg<'_>,
    dim: usize,
    interleaved: bool,
    max_positions: usize,
    partial: Option<f64>,
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
    rope_from(c, p, theta, dim, interleaved, max_positions, partial)
}

/// Reads one object of rope parameters `p` (its own `rope_theta` required), for heads of `dim`
/// (see [`read_rope`]): DeepSeek-V4's `rope_parameters.main` and `.compress`.
pub(crate) fn read_rope_object(
    p: &Cfg<'_>,
    dim: usize,
    interleaved: bool,
    max_positions: usize,
    partial: Option<f64>,
) -> Result<RopeConfig, ModelError> {
    if !p.v.is_object() {
        return Err(p.err("", "expected an object"));
    }
    let theta = p.f64("rope_theta")?;
    if theta <= 0.0 {
        return Err(p.err("rope_theta", "must be positive"));
    }
    let q = Cfg {
        v: p.v,
        file: p.file,
        prefix: p.prefix.clone(),
    };
    Ok(rope_from(p, Some(q), theta, dim, interleaved, max_positions, partial)?.0)
}

/// [`read_rope`] once θ is known: `p` the parameters' object, if any.
fn rope_from(
    c: &Cfg<'_>,
    p: Option<Cfg<'_>>,
    theta: f64,
    dim: usize,
    interleaved: bool,
    max_positions: usize,
    partial: Option<f64>,
) -> Result<(RopeConfig, Option<(f64, f64)>), ModelError> {
    let Some(p) = p else {
        let dim = rotary_dim(c, None, dim, partial)?;
        return Ok((
            RopeConfig {
                theta,
                dim,
                interleaved,
                scaling: RopeScaling::None,
                learned: false,
            },
            None,
        ));
    };
    if !p.v.is_object() {
        return Err(c.err(p.prefix.trim_end_matches('.'), "expected an object"));
    }
    let ty = match (p.get("rope_type"), p.get("type")) {
        (Some(_), _) => p.str("rope_type")?,
        (None, Some(_)) => p.str("type")?,
        (None, None) => "default",
    };
    let dim = rotary_dim(c, Some(&p), dim, partial)?;
    let mut extra = None;
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: p.f64("factor")?,
        },
        "llama3" => {
            let low = p.f64("low_freq_factor")?;
            let high = p.f64("high_freq_factor")?;
            if high <= low {
                return Err(p.err(
                    "high_freq_factor",
                    format!("{high} is not above low_freq_factor {low}"),
                ));
            }
            let factor = p.f64("factor")?;
            if factor <= 0.0 {
                return Err(p.err("factor", "must be positive"));
            }
            let original = p.f64("original_max_position_embeddings")?;
            if original <= 0.0 {
                return Err(p.err("original_max_position_embeddings", "must be positive"));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            }
        }
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
                format!("`{other}` is not supported (supported: default, linear, llama3, yarn)"),
            ));
        }
    };
    Ok((
        RopeConfig {
            theta,
            dim,
            interleaved,
            scaling,
            learned: false,
        },
        extra,
    ))
}
