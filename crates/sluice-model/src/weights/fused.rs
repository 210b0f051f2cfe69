//! Experts fused per layer: [`concat_experts`] (transformers 5's own layout, Qwen3.5), and
//! GPT-OSS's layout: `gate_up_proj` `[experts, in, 2 × inter]` with
//! gate and up interleaved by row, `down_proj` `[experts, inter, out]`, both with biases, in
//! BF16 (the `x @ W` layout) or as MXFP4 blocks and scales. Each expert's slice of a fused
//! tensor is a contiguous byte range, so each expert is still one blob of its own.

use sluice_format::{Dtype, TensorInfo};
use sluice_kernels::{Codes, ScaleType};
use sluice_store::Piece;

use super::{
    BiasedMlpSpec, ExpertSpec, FusedExpertSpec, GateUpSpec, MatSpec, MlpSpec, PartLayout,
    ScaleSpec, VecSpec,
};
use crate::ModelError;
use crate::config::ModelConfig;
use crate::spec::{Ctx, build_part, check_dtype, check_shape, codes_of, scale_type, tensor_err};

/// The byte range of entry `i` of the `n` along a tensor's first dimension.
fn slice(t: &TensorInfo, i: usize, n: usize) -> Piece {
    let per = t.len / n as u64;
    Piece {
        shard: t.shard as u32,
        offset: t.offset + i as u64 * per,
        len: per,
    }
}

/// `{base}.gate_up_proj` and `{base}.down_proj` of the two `shapes` (`why` saying each layout in
/// an error), in dense codings, with their codes.
fn dense_pair<'c>(
    ck: &'c sluice_format::Checkpoint,
    base: &str,
    shapes: [&[usize]; 2],
    why: [&str; 2],
) -> Result<[(&'c TensorInfo, Codes); 2], ModelError> {
    let mut out = Vec::with_capacity(2);
    for ((stem, shape), why) in ["gate_up_proj", "down_proj"].iter().zip(shapes).zip(why) {
        let t = ck.tensor(&format!("{base}.{stem}"))?;
        check_shape(t, shape, why)?;
        out.push((t, codes_of(t)?));
    }
    Ok([out[0], out[1]])
}

/// Experts fused per layer the way transformers 5 keeps them (Qwen3.5's released layout):
/// `gate_up_proj` `[experts, 2 × inter, in]` (each expert's gate rows, then its up rows) and
/// `down_proj` `[experts, out, inter]`, no biases, dense codings only. Each expert's slice is
/// contiguous, and its gate and up halves are too: an expert is one blob of three pieces.
pub(super) fn concat_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    base: &str,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let ck = ctx.ck;
    let (n, inter) = (cfg.moe.experts, cfg.moe.intermediate);
    let width = cfg.moe.expert_width(cfg.hidden);
    let [(gu, gu_codes), (down, down_codes)] = dense_pair(
        ck,
        base,
        [&[n, 2 * inter, width], &[n, width, inter]],
        [" ([experts, 2 × inter, in])", " ([experts, out, inter])"],
    )?;
    let mut pieces = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for e in 0..n {
        let both = slice(gu, e, n);
        let half = both.len / 2;
        let gate = Piece { len: half, ..both };
        let up = Piece {
            offset: both.offset + half,
            len: half,
            ..both
        };
        let part = PartLayout::from_ranges(vec![
            ("gate".to_owned(), gate),
            ("up".to_owned(), up),
            ("down".to_owned(), slice(down, e, n)),
        ]);
        let m = |name: &str, codes, rows, cols| MatSpec::dense(part.piece(name), codes, rows, cols);
        specs.push(ExpertSpec::SwiGlu(MlpSpec {
            gate: m("gate", gu_codes, inter, width),
            up: m("up", gu_codes, inter, width),
            down: m("down", down_codes, width, inter),
        }));
        pieces.push(part.pieces);
    }
    Ok((pieces, specs))
}

/// Experts stacked per projection (Step-3.7's released layout): `{base}.{gate}` and `{base}.{up}`
/// `[experts, inter, in]`, `{base}.{down}` `[experts, out, inter]`, no biases, dense codings
/// only. Each expert's slice of each is contiguous: an expert is one blob of three pieces.
pub(super) fn stacked_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    base: &str,
    [gate, up, down]: [&str; 3],
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let ck = ctx.ck;
    let (n, inter) = (cfg.moe.experts, cfg.moe.intermediate);
    let width = cfg.moe.expert_width(cfg.hidden);
    let mut tensors = Vec::with_capacity(3);
    for (stem, shape, why) in [
        (gate, [n, inter, width], " ([experts, inter, in])"),
        (up, [n, inter, width], " ([experts, inter, in])"),
        (down, [n, width, inter], " ([experts, out, inter])"),
    ] {
        let t = ck.tensor(&format!("{base}.{stem}"))?;
        check_shape(t, &shape, why)?;
        tensors.push((t, codes_of(t)?));
    }
    let mut pieces = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for e in 0..n {
        let part = PartLayout::from_ranges(
            ["gate", "up", "down"]
                .iter()
                .zip(&tensors)
                .map(|(name, (t, _))| ((*name).to_owned(), slice(t, e, n)))
                .collect(),
        );
        let m = |i: usize, name: &str, rows, cols| {
            MatSpec::dense(part.piece(name), tensors[i].1, rows, cols)
        };
        specs.push(ExpertSpec::SwiGlu(MlpSpec {
            gate: m(0, "gate", inter, width),
            up: m(1, "up", inter, width),
            down: m(2, "down", width, inter),
        }));
        pieces.push(part.pieces);
    }
    Ok((pieces, specs))
}

/// Llama 4's fused experts: `gate_up_proj` `[experts, in, 2 × inter]` and `down_proj`
/// `[experts, inter, out]` in the `x @ W` layout, no biases, dense codings only; one blob per
/// expert of two pieces, the gate and up kept as one product whose halves are split after it.
pub(super) fn xw_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    base: &str,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let ck = ctx.ck;
    let (n, inter) = (cfg.moe.experts, cfg.moe.intermediate);
    let width = cfg.moe.expert_width(cfg.hidden);
    let [(gu, gu_codes), (down, down_codes)] = dense_pair(
        ck,
        base,
        [&[n, width, 2 * inter], &[n, inter, width]],
        [
            " ([experts, in, 2 × inter]: the x @ W layout)",
            " ([experts, inter, out]: the x @ W layout)",
        ],
    )?;
    let mut pieces = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for e in 0..n {
        let part = PartLayout::from_ranges(vec![
            ("gate_up".to_owned(), slice(gu, e, n)),
            ("down".to_owned(), slice(down, e, n)),
        ]);
        let xw = |name: &str, codes, rows, cols| MatSpec {
            transposed: true,
            rope_rows: 0,
            ..MatSpec::dense(part.piece(name), codes, rows, cols)
        };
        specs.push(ExpertSpec::GateUp(GateUpSpec {
            gate_up: xw("gate_up", gu_codes, 2 * inter, width),
            down: xw("down", down_codes, width, inter),
        }));
        pieces.push(part.pieces);
    }
    Ok((pieces, specs))
}

/// The fused experts under `base` (`{moe}.experts`), cut into one blob per expert: each expert's slice of a
/// fused tensor is a contiguous byte range.
pub(super) fn fused_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    base: &str,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let ck = ctx.ck;
    let (n, h, inter) = (cfg.moe.experts, cfg.hidden, cfg.moe.intermediate);
    let fused_stored = ["gate_up_proj", "gate_up_proj_blocks"]
        .iter()
        .any(|s| ck.get(&format!("{base}.{s}")).is_some());
    if !fused_stored && ck.get(&format!("{base}.0.gate_proj.weight")).is_some() {
        return biased_experts(ctx, cfg, base);
    }
    let mxfp4 = ctx.m.fused_mxfp4(base);
    // (tensor stem, output features, input features)
    let projs = [("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)];
    struct Fused<'t> {
        stem: &'static str,
        rows: usize,
        cols: usize,
        weight: &'t TensorInfo,
        scales: Option<(&'t TensorInfo, ScaleType)>,
        bias: &'t TensorInfo,
    }
    let mut fused = Vec::with_capacity(2);
    for (stem, rows, cols) in projs {
        let name = format!("{base}.{stem}");
        let (weight, scales) = if mxfp4 {
            let bn = format!("{name}_blocks");
            let sn = format!("{name}_scales");
            for t in [&bn, &sn] {
                if ck.get(t).is_none() {
                    return Err(tensor_err(
                        t,
                        format!(
                            "missing: quantization_config (quant_method mxfp4) converts `{base}` \
                             to MXFP4 blocks and scales"
                        ),
                    ));
                }
            }
            let b = ck.tensor(&bn)?;
            if !cols.is_multiple_of(32) {
                return Err(tensor_err(
                    &bn,
                    format!("{cols} input features are not whole blocks of 32"),
                ));
            }
            check_dtype(b, &[Dtype::U8], "MXFP4 blocks")?;
            check_shape(
                b,
                &[n, rows, cols / 32, 16],
                " ([experts, out, in / 32, 16]: 32 E2M1 codes in 16 bytes per block)",
            )?;
            let s = ck.tensor(&sn)?;
            let ty = scale_type(s, &[Dtype::U8, Dtype::F8E8M0])?;
            check_shape(s, &[n, rows, cols / 32], ": one E8M0 scale per block of 32")?;
            (b, Some((s, ty)))
        } else {
            let Some(w) = ck.get(&name) else {
                let blocks = format!("{name}_blocks");
                return Err(tensor_err(
                    &name,
                    if ck.get(&blocks).is_some() {
                        format!(
                            "missing: the checkpoint stores `{blocks}`; reading it needs \
                             quantization_config with quant_method mxfp4 that converts `{base}`"
                        )
                    } else {
                        "missing".to_owned()
                    },
                ));
            };
            codes_of(w)?;
            check_shape(
                w,
                &[n, cols, rows],
                " ([experts, in, out]: the x @ W layout)",
            )?;
            (w, None)
        };
        let bias = ck.tensor(&format!("{name}_bias"))?;
        check_dtype(bias, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a bias")?;
        check_shape(bias, &[n, rows], "")?;
        fused.push(Fused {
            stem,
            rows,
            cols,
            weight,
            scales,
            bias,
        });
    }
    let mut pieces = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for e in 0..n {
        let mut items = Vec::with_capacity(6);
        for f in &fused {
            items.push((f.stem.to_owned(), slice(f.weight, e, n)));
            items.push((format!("{}.bias", f.stem), slice(f.bias, e, n)));
            if let Some((s, _)) = f.scales {
                items.push((format!("{}.scales", f.stem), slice(s, e, n)));
            }
        }
        let part = PartLayout::from_ranges(items);
        let spec = |f: &Fused<'_>| -> Result<(MatSpec, VecSpec), ModelError> {
            let m = MatSpec {
                piece: part.piece(f.stem),
                codes: match f.scales {
                    Some(_) => Codes::E2M1,
                    None => codes_of(f.weight)?,
                },
                rows: f.rows,
                cols: f.cols,
                scales: f.scales.map(|(_, ty)| ScaleSpec {
                    piece: part.piece(&format!("{}.scales", f.stem)),
                    ty,
                    group_rows: 1,
                    group_cols: 32,
                }),
                transposed: f.scales.is_none(),
                rope_rows: 0,
            };
            let b = VecSpec {
                piece: part.piece(&format!("{}.bias", f.stem)),
                codes: codes_of(f.bias)?,
                len: f.rows,
                plus_one: false,
                rope_rows: 0,
            };
            Ok((m, b))
        };
        let (gate_up, gate_up_bias) = spec(&fused[0])?;
        let (down, down_bias) = spec(&fused[1])?;
        specs.push(ExpertSpec::Fused(FusedExpertSpec {
            gate_up,
            gate_up_bias,
            down,
            down_bias,
        }));
        pieces.push(part.pieces);
    }
    Ok((pieces, specs))
}

/// The same experts stored one module per expert, `{base}.{e}.{gate_proj,up_proj,down_proj}`,
/// each with its `.weight` `[out, in]` in any coding and its `.bias` — GPT-OSS as a GGUF file
/// holds them once the stacked tensors are cut per expert (the converter split `gate_up_proj`
/// into its even rows, the gate, and its odd rows, the up).
fn biased_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    base: &str,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let (h, inter) = (cfg.hidden, cfg.moe.intermediate);
    let mut pieces = Vec::with_capacity(cfg.moe.experts);
    let mut specs = Vec::with_capacity(cfg.moe.experts);
    for e in 0..cfg.moe.experts {
        let name = |w: &str| format!("{base}.{e}.{w}");
        let (part, spec) = build_part(ctx, |p| {
            Ok(BiasedMlpSpec {
                mlp: MlpSpec {
                    gate: p.linear(&name("gate_proj"), inter, h)?,
                    up: p.linear(&name("up_proj"), inter, h)?,
                    down: p.linear(&name("down_proj"), h, inter)?,
                },
                gate_bias: p.vector(&name("gate_proj.bias"), inter)?,
                up_bias: p.vector(&name("up_proj.bias"), inter)?,
                down_bias: p.vector(&name("down_proj.bias"), h)?,
            })
        })?;
        pieces.push(part.pieces);
        specs.push(ExpertSpec::Biased(spec));
    }
    Ok((pieces, specs))
}
