//! Generated chat templates rendered under the limits (issue 59): loops over ranges, nested;
//! strings and lists doubled by `~`, `+` and `*`; captures; macros calling themselves; the
//! filters and methods that can build far more than they are given; raw text. Every render
//! must finish (libFuzzer's `-timeout`), stay small (`-rss_limit_mb`), and succeed or fail
//! with a one-line error; what it writes stays within the limit.
//!
//! Input: byte 0 chooses generated (even) or raw template text (odd); the rest drives
//! `arbitrary` or is the template.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use sluice_text::chat::{ChatTemplate, Message, RenderLimits};

/// An expression that makes a value of some size from `v`, a variable holding a string.
fn grow(u: &mut Unstructured<'_>, v: &str) -> arbitrary::Result<String> {
    let n = *u.choose(&[2u32, 10, 1000, 100_000_000])?;
    Ok(match u.int_in_range(0..=10)? {
        0 => format!("{v} ~ {v}"),
        1 => format!("{v} + {v}"),
        2 => format!("{v} * {n}"),
        3 => format!("{v} | replace('', {v})"),
        4 => format!("{v}.replace('a', {v} ~ {v})"),
        5 => format!("{v} | indent({n})"),
        6 => format!("{v}.join([{v}, {v}, {v}])"),
        7 => format!("'%{n}s' | format({v})"),
        8 => format!("[{v}, {v}] | join({v})"),
        9 => format!("({v} ~ 'x') | upper"),
        _ => format!("{v}[1:] ~ {v}[:{n}]"),
    })
}

/// A statement, at most `depth` more levels deep.
fn stmt(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<String> {
    let n = *u.choose(&[1u32, 3, 64, 1000, 100_000])?;
    Ok(match u.int_in_range(0..=if depth == 0 { 4 } else { 8 })? {
        0 => format!("{{% set ns.s = {} %}}", grow(u, "ns.s")?),
        1 => "{{ ns.s }}".into(),
        2 => "x".repeat(*u.choose(&[1usize, 100, 10_000])?),
        3 => format!("{{% set ns.l = ns.l + ns.l %}}{{{{ ns.l | length }}}}"),
        4 => "{{ messages[0].content }}".into(),
        5 => format!("{{% for i in range({n}) %}}{}{{% endfor %}}", stmt(u, depth - 1)?),
        6 => format!(
            "{{% set t %}}{}{}{{% endset %}}{{% set ns.s = t %}}",
            stmt(u, depth - 1)?,
            stmt(u, depth - 1)?
        ),
        7 => format!(
            "{{% macro f(k) %}}{{% if k > 0 %}}{}{{{{ f(k - 1) }}}}{{{{ f(k - 1) }}}}{{% endif %}}{{% endmacro %}}{{{{ f({}) }}}}",
            stmt(u, depth - 1)?,
            u.int_in_range(0..=40u32)?
        ),
        _ => format!("{}{}", stmt(u, depth - 1)?, stmt(u, depth - 1)?),
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let src = if pick % 2 == 0 {
        let mut u = Unstructured::new(rest);
        let mut s = String::from("{% set ns = namespace(s='ab', l=[1]) %}");
        for _ in 0..u.int_in_range(1..=4u32).unwrap_or(1) {
            match stmt(&mut u, 3) {
                Ok(x) => s.push_str(&x),
                Err(_) => break,
            }
        }
        s
    } else {
        String::from_utf8_lossy(rest).into_owned()
    };
    let limits = RenderLimits::for_prompt_bytes(4096);
    let t = match ChatTemplate::new(&src, "<s>".into(), "</s>".into(), "t".into()) {
        Ok(t) => t.with_limits(limits),
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "{e}");
            return;
        }
    };
    match t.render(&[Message::new("user", "hello")], true) {
        // The input is small: what may be written is the limit plus 64 KiB.
        Ok(out) => assert!(out.len() <= limits.output_bytes.max((64 << 10) + 4096)),
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
