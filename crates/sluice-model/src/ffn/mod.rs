//! Feed-forward blocks, as [`attention`](crate::attention) is for what mixes tokens: one
//! module per part, composed by the block.
//!
//! - [`glu`]: the gated linear unit every block is made of (dense layers, shared experts,
//!   SwiGLU experts), and several of them at once for a decode step.
//! - [`expert`]: one routed expert's maths, by how its weights are stored and its activation.
//! - [`router`]: which experts each token goes to, for every router kind.
//! - [`schedule`]: when each routed expert is fetched and computed — groups the cache can pin,
//!   prefetch of the next layer, compute as reads land. It sees rows and closures, never a
//!   family feature, and decides no bit.
//! - [`moe`]: the mixture-of-experts block composing them in order, with the families'
//!   variations (zero-compute experts, weight on the input, latent space, shortcut, gated
//!   shared expert).

mod expert;
mod glu;
mod moe;
mod router;
mod schedule;

pub(crate) use glu::glu_rows;
pub(crate) use moe::{Ahead, MidGuess, MoeLayer, Run};
pub(crate) use router::route;
