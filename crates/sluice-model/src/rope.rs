//! Rotary position embedding: its parameters ([`RopeConfig`], [`RopeScaling`]) and its tables,
//! including YaRN, computed as transformers computes them.

/// Inverse frequencies and the cos/sin factor of a rope configuration.
#[derive(Clone, Debug)]
pub struct Rope {
    inv_freq: Vec<f32>,
    attention_factor: f32,
    interleaved: bool,
}

impl Rope {
    /// Builds the table for `cfg` (inverse frequencies in f32 as transformers computes them; the
    /// power uses f64 and rounds once).
    pub fn new(cfg: &RopeConfig) -> Rope {
        let dim = cfg.dim;
        let half = dim / 2;
        let base = cfg.theta;
        // pos_freqs[i] = base ** (2i / dim), in f32.
        let pos_freqs: Vec<f32> = (0..half)
            .map(|i| base.powf((2 * i) as f64 / dim as f64) as f32)
            .collect();
        let (inv_freq, attention_factor) = match &cfg.scaling {
            RopeScaling::None => (pos_freqs.iter().map(|&p| 1.0 / p).collect(), 1.0f64),
            RopeScaling::Linear { factor } => (
                pos_freqs
                    .iter()
                    .map(|&p| (1.0 / p) / *factor as f32)
                    .collect(),
                1.0,
            ),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => (
                llama3(
                    &pos_freqs,
                    *factor,
                    *low_freq_factor,
                    *high_freq_factor,
                    *old,
                ),
                1.0,
            ),
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: orig,
                beta_fast,
                beta_slow,
                attention_factor,
                mscale,
                mscale_all_dim,
                truncate,
            } => {
                let af = match attention_factor {
                    Some(a) => *a,
                    None => match (mscale, mscale_all_dim) {
                        (Some(m), Some(a)) if *m != 0.0 && *a != 0.0 => {
                            yarn_get_mscale(*factor, *m) / yarn_get_mscale(*factor, *a)
                        }
                        _ => yarn_get_mscale(*factor, 1.0),
                    },
                };
                let corr = |rot: f64| {
                    (dim as f64 * (orig / (rot * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr(*beta_fast), corr(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0) as f32;
                let mut high = high.min(dim as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                let f = *factor as f32;
                let inv = (0..half)
                    .map(|i| {
                        let extra = 1.0 / pos_freqs[i];
                        let inter = 1.0 / (f * pos_freqs[i]);
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extra_factor = 1.0 - ramp;
                        inter * (1.0 - extra_factor) + extra * extra_factor
                    })
                    .collect();
                (inv, af)
            }
        };
        Rope {
            inv_freq,
            attention_factor: attention_factor as f32,
            interleaved: cfg.interleaved,
        }
    }

    /// Multiplies each inverse frequency by `exp(α)` (the learned factors of Mistral Large 4's
    /// LeRoPE, in f32 as transformers computes them).
    pub fn learn(&mut self, alpha: &[f32]) {
        for (f, &a) in self.inv_freq.iter_mut().zip(alpha) {
            *f *= a.exp();
        }
    }

    /// Number of rotated pairs.
    pub fn pairs(&self) -> usize {
        self.inv_freq.len()
    }

    /// cos and sin of each pair's angle at `pos` (scaled by the YaRN attention factor).
    pub fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let a = (pos as f32 * f) as f64;
            cos[i] = (libm::cos(a) as f32) * self.attention_factor;
            sin[i] = (libm::sin(a) as f32) * self.attention_factor;
        }
    }

    /// Rotates `x` (one head's rotary part) by the angles given.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        if self.interleaved {
            sluice_kernels::scalar::rope_interleaved(x, cos, sin)
        } else {
            sluice_kernels::scalar::rope_half(x, cos, sin)
        }
    }
}

/// Llama 3's inverse frequencies, in f32 step by step as transformers computes them (a scalar
/// over a tensor is the tensor's reciprocal times the scalar, as torch evaluates it).
fn llama3(pos_freqs: &[f32], factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
    let (factor, old) = (factor as f32, old as f32);
    let low_wavelen = (old as f64 / low) as f32;
    let high_wavelen = (old as f64 / high) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let span = (high - low) as f32;
    pos_freqs
        .iter()
        .map(|&p| {
            let inv = 1.0 / p;
            let wavelen = (1.0 / inv) * two_pi;
            let scaled = if wavelen > low_wavelen {
                inv / factor
            } else {
                inv
            };
            if wavelen < high_wavelen || wavelen > low_wavelen {
                return scaled;
            }
            let smooth = ((1.0 / wavelen) * old - low as f32) / span;
            (1.0 - smooth) * scaled / factor + smooth * scaled
        })
        .collect()
}

/// cos/sin for a run of positions, computed once per forward pass and shared by every layer.
#[derive(Clone, Debug, Default)]
pub struct Angles {
    pairs: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Angles {
    /// Angles for positions `start..start + n`.
    pub fn new(rope: &Rope, start: usize, n: usize) -> Angles {
        let p = rope.pairs();
        let mut cos = vec![0f32; n * p];
        let mut sin = vec![0f32; n * p];
        for i in 0..n {
            rope.angles(
                start + i,
                &mut cos[i * p..(i + 1) * p],
                &mut sin[i * p..(i + 1) * p],
            );
        }
        Angles { pairs: p, cos, sin }
    }

    /// cos and sin of the `i`-th position.
    pub fn get(&self, i: usize) -> (&[f32], &[f32]) {
        let p = self.pairs;
        (&self.cos[i * p..(i + 1) * p], &self.sin[i * p..(i + 1) * p])
    }
}

/// Rotary position embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base θ.
    pub theta: f64,
    /// Rotated dimensions per head.
    pub dim: usize,
    /// Pairs are adjacent (`(x0, x1), (x2, x3)`) rather than split halves.
    pub interleaved: bool,
    /// Context-extension scaling.
    pub scaling: RopeScaling,
    /// Each inverse frequency is multiplied by `exp(α)`, `α` the learned tensor
    /// `{model}rotary_emb.alpha` (Mistral Large 4's LeRoPE).
    pub learned: bool,
}

impl RopeConfig {
    /// No rotary table: nothing is rotated (Kimi Linear, GLM-5.3).
    pub fn none() -> RopeConfig {
        RopeConfig {
            theta: 1.0,
            dim: 0,
            interleaved: false,
            scaling: RopeScaling::None,
            learned: false,
        }
    }
}

/// RoPE scaling variants implemented.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation by a constant factor.
    Linear {
        /// The factor.
        factor: f64,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth ramp between
    /// (transformers' `_compute_llama3_parameters`).
    Llama3 {
        /// Extension factor.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// Pre-training context length.
        original_max_position_embeddings: f64,
    },
    /// YaRN (as transformers computes it).
    Yarn {
        /// Extension factor.
        factor: f64,
        /// Pre-training context length.
        original_max_position_embeddings: f64,
        /// Fast boundary of the ramp.
        beta_fast: f64,
        /// Slow boundary of the ramp.
        beta_slow: f64,
        /// Explicit cos/sin factor, when given.
        attention_factor: Option<f64>,
        /// `mscale`, when given.
        mscale: Option<f64>,
        /// `mscale_all_dim`, when given.
        mscale_all_dim: Option<f64>,
        /// Whether the correction range is truncated to integers.
        truncate: bool,
    },
}

/// transformers' `yarn_get_mscale`.
pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}
