//! sluice (under construction).
