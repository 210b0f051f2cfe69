//! Streaming text on stdout with live figures on stderr.
//!
//! When stdout and stderr are the same terminal, a short dim status (tokens/s, expert hit rate)
//! is drawn just after the cursor and erased before the next text, so it never mixes into the
//! text. When stdout is redirected, a spinner on stderr carries the figures. At the end a summary
//! line goes to stderr. A prompt that takes more than a second shows its progress on stderr
//! when stderr is a terminal (tokens done of all, tokens/s, expert bytes read).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use sluice::{Engine, GenerationStats, PrefillHook, PrefillProgress};

/// Live output of one generation.
pub struct Live {
    inline: bool,
    bar: Option<indicatif::ProgressBar>,
    shown: bool,
    last: Instant,
    started: Instant,
}

fn hit_rate(s: &GenerationStats) -> f64 {
    if s.expert_requests == 0 {
        100.0
    } else {
        100.0 * s.expert_hits as f64 / s.expert_requests as f64
    }
}

fn rate(s: &GenerationStats) -> f64 {
    if s.decode_seconds > 0.0 {
        s.decode_tokens as f64 / s.decode_seconds
    } else {
        0.0
    }
}

impl Live {
    /// Chooses the display for this process's stdout and stderr.
    pub fn new(_engine: &Engine) -> Live {
        let out_tty = std::io::stdout().is_terminal();
        let err_tty = std::io::stderr().is_terminal();
        let bar = (!out_tty && err_tty).then(|| {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Live {
            inline: out_tty && err_tty,
            bar,
            shown: false,
            last: Instant::now(),
            started: Instant::now(),
        }
    }

    fn erase(&mut self) {
        if self.shown {
            eprint!("\x1b[K");
            self.shown = false;
        }
    }

    /// Prints generated text.
    pub fn text(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        self.erase();
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "{s}");
        let _ = out.flush();
    }

    /// Updates the figures (at most four times a second).
    pub fn tick(&mut self, s: &GenerationStats) {
        if self.last.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.last = Instant::now();
        let msg = format!("{:.1} tok/s, {:.0}% hits", rate(s), hit_rate(s));
        if self.inline {
            eprint!("\x1b7\x1b[2m  [{msg}]\x1b[0m\x1b8");
            self.shown = true;
        } else if let Some(b) = &self.bar {
            b.set_message(format!("generating: {} tokens, {msg}", s.decode_tokens));
        }
    }

    /// Ends the text and prints the summary.
    pub fn finish(mut self, s: &GenerationStats) {
        self.erase();
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out);
        let _ = out.flush();
        // The budget bounds what sluice allocates; the process's resident set also holds the
        // program itself (its code, the runtime, thread stacks), a few MiB the budget leaves out.
        let budget = if s.memory_budget_bytes == 0 {
            "budget unlimited".to_owned()
        } else {
            format!(
                "budget {}, program not counted",
                sluice::tools::fmt_bytes(s.memory_budget_bytes)
            )
        };
        // A dense model asks for no expert: its line has no expert figures.
        let experts = if s.expert_requests == 0 {
            String::new()
        } else {
            format!(
                "experts {:.1}% hits, {} read, ",
                hit_rate(s),
                sluice::tools::fmt_bytes(s.expert_bytes_read)
            )
        };
        eprintln!(
            "[prompt {} tokens in {:.2}s | {} tokens in {:.2}s, {:.2} tokens/s | {experts}trunk {} read ({} I/O) | peak RSS {} ({budget}) | {} threads, {} | {:.1}s total]",
            s.prefill_tokens,
            s.prefill_seconds,
            s.decode_tokens,
            s.decode_seconds,
            rate(s),
            sluice::tools::fmt_bytes(s.trunk_bytes_read),
            s.io_mode,
            sluice::tools::fmt_bytes(s.peak_rss_bytes),
            s.threads,
            s.isa,
            self.started.elapsed().as_secs_f64(),
        );
    }
}

/// A prefill progress line on stderr when it is a terminal: drawn once the prompt has taken a
/// second, redrawn at most four times a second, erased when the prompt is done.
pub fn prefill_hook() -> Option<PrefillHook> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    // When the line was last drawn (None: not drawn yet).
    let drawn: Mutex<Option<Instant>> = Mutex::new(None);
    Some(PrefillHook(Arc::new(move |p: &PrefillProgress| {
        let Ok(mut last) = drawn.lock() else {
            return;
        };
        if p.done >= p.total {
            if last.is_some() {
                eprint!("\r\x1b[K");
                *last = None;
            }
            return;
        }
        if p.seconds < 1.0 || last.is_some_and(|t| t.elapsed() < Duration::from_millis(250)) {
            return;
        }
        *last = Some(Instant::now());
        eprint!(
            "\r\x1b[K[prefill {}/{} tokens, {:.1} tok/s, experts {} read]",
            p.done,
            p.total,
            p.done as f64 / p.seconds.max(1e-9),
            sluice::tools::fmt_bytes(p.expert_bytes_read)
        );
    })))
}
