//! sluice-sampler (under construction).
