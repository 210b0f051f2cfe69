//! sluice-model (under construction).
