//! sluice-kernels (under construction).
