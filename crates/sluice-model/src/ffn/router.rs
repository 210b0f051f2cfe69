//! Routing: which experts each token goes to and with what weight, for every router kind the
//! families use (softmax top-k, DeepSeek's sigmoid group top-k with its selection bias,
//! DeepSeek-V4's `√softplus`, hash tables of token ids, …).

use sluice_kernels::scalar;
use sluice_store::Blob;

use crate::ModelError;
use crate::config::{ModelConfig, RouterKind};
use crate::weights::TableSpec;

/// One token's routing: `(expert, weight)` sorted by expert id.
pub(crate) type Selection = Vec<(u32, f32)>;

/// Routes one token from its router logits. `bias` is DeepSeek's or ERNIE's selection-only
/// score bias, or GPT-OSS's router bias (added to the logits).
pub(crate) fn route(cfg: &ModelConfig, logits: &mut [f32], bias: Option<&[f32]>) -> Selection {
    let k = cfg.moe.top_k;
    let mut sel: Selection = match &cfg.moe.router {
        RouterKind::Softmax { norm_topk_prob } => {
            scalar::softmax(logits);
            let top = scalar::top_k(logits, k);
            let mut w: Vec<f32> = top.iter().map(|p| p.1).collect();
            if *norm_topk_prob {
                let s: f32 = w.iter().sum();
                for x in &mut w {
                    *x /= s;
                }
            }
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
        RouterKind::SigmoidGroup {
            n_group,
            topk_group,
            norm_topk_prob,
            routed_scaling_factor,
        } => {
            let scores: Vec<f32> = logits.iter().map(|&l| scalar::sigmoid(l)).collect();
            let choice: Vec<f32> = match bias {
                Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            let top = group_top_k(&choice, *n_group, *topk_group, k);
            let mut w: Vec<f32> = top.iter().map(|p| scores[p.0]).collect();
            if *norm_topk_prob {
                let s: f32 = w.iter().sum::<f32>() + 1e-20;
                for x in &mut w {
                    *x /= s;
                }
            }
            for x in &mut w {
                *x *= routed_scaling_factor;
            }
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
        RouterKind::SoftmaxGroup {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => {
            scalar::softmax(logits);
            let top = group_top_k(logits, *n_group, *topk_group, k);
            let s: f32 = top.iter().map(|p| logits[p.0]).sum::<f32>() + 1e-20;
            top.iter()
                .map(|p| (p.0 as u32, logits[p.0] / s * routed_scaling_factor))
                .collect()
        }
        RouterKind::TopKSigmoid => {
            let top = scalar::top_k(logits, k);
            top.iter()
                .map(|p| (p.0 as u32, scalar::sigmoid(p.1)))
                .collect()
        }
        RouterKind::SoftmaxBiased { norm_min } => {
            scalar::softmax(logits);
            let choice: Vec<f32> = match bias {
                Some(b) => logits.iter().zip(b).map(|(p, b)| p + b).collect(),
                None => logits.to_vec(),
            };
            let top = scalar::top_k(&choice, k);
            let s = top.iter().map(|p| logits[p.0]).sum::<f32>().max(*norm_min);
            top.iter().map(|p| (p.0 as u32, logits[p.0] / s)).collect()
        }
        RouterKind::SoftmaxScaled {
            routed_scaling_factor,
        } => {
            scalar::softmax(logits);
            let choice: Vec<f32> = match bias {
                Some(b) => logits.iter().zip(b).map(|(p, b)| p + b).collect(),
                None => logits.to_vec(),
            };
            let top = scalar::top_k(&choice, k);
            top.iter()
                .map(|p| (p.0 as u32, logits[p.0] * routed_scaling_factor))
                .collect()
        }
        RouterKind::SqrtSoftplus {
            routed_scaling_factor,
        } => {
            let scores = router_scores(&cfg.moe.router, logits).unwrap_or_default();
            let choice: Vec<f32> = match bias {
                Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            let ids: Vec<u32> = scalar::top_k(&choice, k)
                .iter()
                .map(|p| p.0 as u32)
                .collect();
            weigh(&scores, &ids, *routed_scaling_factor)
        }
        RouterKind::TopKSoftmax => {
            if let Some(b) = bias {
                for (l, &b) in logits.iter_mut().zip(b) {
                    *l += b;
                }
            }
            let top = scalar::top_k(logits, k);
            let mut w: Vec<f32> = top.iter().map(|p| p.1).collect();
            scalar::softmax(&mut w);
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
    };
    sel.sort_by_key(|p| p.0);
    sel
}

/// `√softplus(x)` as torch computes it (`softplus` is `x` above 20).
fn sqrt_softplus(x: f32) -> f32 {
    let sp = if x > 20.0 { x } else { libm::log1pf(x.exp()) };
    sp.sqrt()
}

/// The experts `ids`, each weighted by its score over the chosen scores' sum (plus 1e-20),
/// times `scale`.
fn weigh(scores: &[f32], ids: &[u32], scale: f32) -> Selection {
    let s: f32 = ids.iter().map(|&e| scores[e as usize]).sum::<f32>() + 1e-20;
    ids.iter()
        .map(|&e| (e, scores[e as usize] / s * scale))
        .collect()
}

/// Per expert, the score of a router that scores experts independently (DeepSeek-V4's
/// `√softplus`, or sigmoid), which a hash-routed layer weighs its experts by; `None` for the
/// others.
fn router_scores(router: &RouterKind, logits: &[f32]) -> Option<Vec<f32>> {
    match router {
        RouterKind::SqrtSoftplus { .. } => Some(logits.iter().map(|&l| sqrt_softplus(l)).collect()),
        RouterKind::SigmoidGroup { .. } => {
            Some(logits.iter().map(|&l| scalar::sigmoid(l)).collect())
        }
        _ => None,
    }
}

/// Routes one token of a hash-routed layer: the experts its row of the table gives, weighed
/// by the router's scores as [`route`] weighs its choices.
pub(crate) fn route_hashed(
    cfg: &ModelConfig,
    logits: &[f32],
    ids: &[u32],
) -> Result<Selection, ModelError> {
    let scale = match &cfg.moe.router {
        RouterKind::SqrtSoftplus {
            routed_scaling_factor,
        }
        | RouterKind::SigmoidGroup {
            routed_scaling_factor,
            ..
        } => *routed_scaling_factor,
        _ => 1.0,
    };
    let scores = router_scores(&cfg.moe.router, logits).ok_or_else(|| ModelError::Mismatch {
        what: "a hash-routed layer with a router that does not score".into(),
    })?;
    let mut sel = weigh(&scores, ids, scale);
    sel.sort_by_key(|p| p.0);
    Ok(sel)
}

/// DeepSeek's group-limited top-k of `choice`: the experts in `n_group` equal groups, each group
/// scored by the sum of its two best, the top `k` of the `topk_group` best groups' experts.
fn group_top_k(choice: &[f32], n_group: usize, topk_group: usize, k: usize) -> Vec<(usize, f32)> {
    let gs = choice.len() / n_group;
    let group_scores: Vec<f32> = choice
        .chunks_exact(gs)
        .map(|g| {
            let t = scalar::top_k(g, 2);
            t[0].1 + t[1].1
        })
        .collect();
    let mut keep = vec![false; n_group];
    for (g, _) in scalar::top_k(&group_scores, topk_group) {
        keep[g] = true;
    }
    let masked: Vec<f32> = choice
        .iter()
        .enumerate()
        .map(|(e, &c)| if keep[e / gs] { c } else { f32::NEG_INFINITY })
        .collect();
    scalar::top_k(&masked, k)
}

/// The routing of `t` tokens from their `[t, width]` router logits: by the layer's table of
/// token ids (`hash`, read from `blob`) when it has one, each row's token in `tokens`; else by
/// the router, `bias` its selection bias.
pub(super) fn select(
    cfg: &ModelConfig,
    logits: &mut [f32],
    bias: Option<&[f32]>,
    hash: Option<&TableSpec>,
    blob: &Blob,
    tokens: &[u32],
) -> Result<Vec<Selection>, ModelError> {
    let ne = cfg.moe.router_width();
    match hash {
        Some(table) => {
            if tokens.len() * ne != logits.len() {
                return Err(ModelError::Mismatch {
                    what: "a hash-routed layer needs each row's token".into(),
                });
            }
            logits
                .chunks_exact(ne)
                .zip(tokens)
                .map(|(l, &tok)| {
                    let ids = table.row(blob, tok as usize, cfg.moe.experts)?;
                    route_hashed(cfg, l, &ids)
                })
                .collect()
        }
        None => Ok(logits
            .chunks_exact_mut(ne)
            .map(|l| route(cfg, l, bias))
            .collect()),
    }
}
