//! sluice-store (under construction).
