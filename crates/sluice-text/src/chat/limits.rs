//! Limits on rendering a chat template: a template comes from a model file, so it is untrusted
//! input. Without limits one could loop for ever (nested `range(100000)` loops), build strings
//! until the process aborts (`{% set s = s ~ s %}` in a loop: 6 GB, then SIGABRT), or write
//! more text than any prompt could hold.
//!
//! - **Fuel**: minijinja's count of instructions, [`RenderLimits::fuel`] per render.
//! - **Text written**: every byte a render writes — `{{ … }}`, the template's own text, into
//!   the output or into a capture (`{% set x %}…{% endset %}`, a macro's output) — counts
//!   against [`RenderLimits::output_bytes`].
//! - **Values built**: every string or sequence the template builds — by `~`, `+`, `*`,
//!   slicing, a filter, a function or a method — counts its size against
//!   [`RenderLimits::built_bytes`], and the filters and methods whose result can be far
//!   larger than their inputs (`replace`, `join`, `indent`, `format`, `slice`, `tojson`'s
//!   indent, `*` of a string or a list) check before they build.
//!
//! The counting works on the compiled template: before each render its instructions are copied
//! with a call to a counting function after each that builds a value or writes text (the
//! functions' names, `sluice:…`, are no identifier a template can write or shadow). So every
//! way a template has of growing memory passes a check, and the first over a limit ends the
//! render with one line saying which. A render's memory is then bounded by its inputs, the
//! template and the limits — whatever the template does.

use std::cell::RefCell;

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::ValueKind;
use minijinja::{ErrorKind, State};

use super::JValue;

/// What one render may spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// Instructions (minijinja's fuel): 10,000,000 by default, about a second of rendering;
    /// a chat of a thousand messages with tools takes a few hundred thousand.
    pub fuel: u64,
    /// Bytes of text written, captures included. The engine sets it to the longest prompt its
    /// context can take.
    pub output_bytes: usize,
    /// Bytes of strings and sequences built (a sequence counts 16 bytes an item), summed over
    /// the render.
    pub built_bytes: usize,
}

impl Default for RenderLimits {
    fn default() -> RenderLimits {
        RenderLimits {
            fuel: 10_000_000,
            output_bytes: 64 << 20,
            built_bytes: 256 << 20,
        }
    }
}

impl RenderLimits {
    /// Limits for prompts of at most `prompt_bytes` bytes: that much text written, and eight
    /// times as much (at least 16 MiB) built along the way.
    pub fn for_prompt_bytes(prompt_bytes: usize) -> RenderLimits {
        RenderLimits {
            output_bytes: prompt_bytes,
            built_bytes: prompt_bytes.saturating_mul(8).max(16 << 20),
            ..RenderLimits::default()
        }
    }
}

/// What the render on this thread has left.
struct Budget {
    limits: RenderLimits,
    written: usize,
    built: usize,
}

thread_local! {
    static BUDGET: RefCell<Option<Budget>> = const { RefCell::new(None) };
}

/// Runs `f` (one render) with `limits` counted on this thread.
pub(super) fn with_budget<T>(limits: RenderLimits, f: impl FnOnce() -> T) -> T {
    let outer = BUDGET.with(|b| {
        b.borrow_mut().replace(Budget {
            limits,
            written: 0,
            built: 0,
        })
    });
    let r = f();
    BUDGET.with(|b| *b.borrow_mut() = outer);
    r
}

fn over(what: String) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, what)
}

/// Counts `n` bytes of text written.
pub(super) fn charge_written(n: usize) -> Result<(), minijinja::Error> {
    BUDGET.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut() else {
            return Ok(());
        };
        b.written = b.written.saturating_add(n);
        if b.written > b.limits.output_bytes {
            return Err(over(format!(
                "the template wrote more than {} bytes, more than any prompt of this model's context can hold",
                b.limits.output_bytes
            )));
        }
        Ok(())
    })
}

/// Counts `n` bytes of values built.
pub(super) fn charge_built(n: usize) -> Result<(), minijinja::Error> {
    BUDGET.with(|b| {
        let mut b = b.borrow_mut();
        let Some(b) = b.as_mut() else {
            return Ok(());
        };
        b.built = b.built.saturating_add(n);
        if b.built > b.limits.built_bytes {
            return Err(over(format!(
                "the template built more than {} bytes of strings and lists",
                b.limits.built_bytes
            )));
        }
        Ok(())
    })
}

/// Refuses, before it is built, a value of `n` bytes that would go past what is left.
pub(super) fn check_room(what: &str, n: u128) -> Result<(), minijinja::Error> {
    BUDGET.with(|b| {
        let b = b.borrow();
        let Some(b) = b.as_ref() else {
            return Ok(());
        };
        let left = b.limits.built_bytes.saturating_sub(b.built) as u128;
        if n > left {
            return Err(over(format!(
                "{what} would build {n} bytes; the template may build {} in all",
                b.limits.built_bytes
            )));
        }
        Ok(())
    })
}

/// The bytes a value counts for: a string its length, a sequence or map 16 bytes an item.
fn size(v: &JValue) -> usize {
    match v.kind() {
        ValueKind::String => v.as_str().map_or(0, str::len),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            v.len().unwrap_or(0).saturating_mul(16)
        }
        _ => 0,
    }
}

/// The counting functions' names: not identifiers, so no template can call or shadow them.
pub(super) const BUILT: &str = "sluice:built";
pub(super) const CALLED: &str = "sluice:called";
pub(super) const WRITTEN: &str = "sluice:written";
pub(super) const MUL: &str = "sluice:mul";

/// `sluice:built(v)`: counts the value just built; returns nothing (it is discarded).
pub(super) fn built(v: JValue) -> Result<JValue, minijinja::Error> {
    charge_built(size(&v))?;
    Ok(JValue::from(()))
}

/// `sluice:called(v)`: counts a function's result if it is a string. Functions (`range`,
/// `dict`, `namespace`, …) return lazy or small containers, counted as they are used.
pub(super) fn called(v: JValue) -> Result<JValue, minijinja::Error> {
    if v.kind() == ValueKind::String {
        charge_built(size(&v))?;
    }
    Ok(JValue::from(()))
}

/// `sluice:written(n)`: counts `n` bytes of the template's own text, just written.
pub(super) fn written(n: usize) -> Result<JValue, minijinja::Error> {
    charge_written(n)?;
    Ok(JValue::from(()))
}

/// `a * b` with a string or a sequence repeated checked first (minijinja allows a 100 MB string
/// and lazily repeats a sequence any number of times, which every filter then iterates).
pub(super) fn mul(state: &State<'_, '_>, a: JValue, b: JValue) -> Result<JValue, minijinja::Error> {
    let repeated = |x: &JValue, n: &JValue| -> Option<u128> {
        let n = n.as_i64()?.max(0) as u128;
        match x.kind() {
            ValueKind::String => Some(x.as_str()?.len() as u128 * n),
            ValueKind::Seq | ValueKind::Iterable => Some(x.len()? as u128 * n * 16),
            _ => None,
        }
    };
    if let Some(n) = repeated(&a, &b).or_else(|| repeated(&b, &a)) {
        check_room("a repetition (`*`)", n)?;
    }
    // The operation itself is minijinja's.
    let expr = state.env().compile_expression("a * b")?;
    expr.eval(minijinja::context! { a => a, b => b })
}

/// The instructions of a compiled template with the counting calls added: after each
/// instruction that builds a value, `DupTop; CallFunction(sluice:built, 1); DiscardTop`; after
/// the template's own text (`EmitRaw`), its length counted; `*` through [`mul`]. Every jump
/// target (loops, conditions, macros) is moved to where its instruction now is.
pub(super) fn counted<'s>(src: &Instructions<'s>) -> Instructions<'s> {
    let n = src.len() as u32;
    let added = |i: &Instruction<'_>| -> u32 {
        match i {
            Instruction::EmitRaw(_) => 3,
            i if builds(i) => 3,
            _ => 0,
        }
    };
    // Where each instruction of `src` goes (one past the end for a jump to the end).
    let mut at = Vec::with_capacity(n as usize + 1);
    let mut k = 0u32;
    for i in 0..n {
        at.push(k);
        k += 1 + src.get(i).map_or(0, added);
    }
    at.push(k);
    let to = |t: &u32| at.get(*t as usize).copied().unwrap_or(k);
    let mut out = Instructions::new(src.name(), src.source());
    for i in 0..n {
        let Some(ins) = src.get(i) else { continue };
        let mut push = |x: Instruction<'s>| match src.get_span(i) {
            Some(span) => out.add_with_span(x, span),
            None => out.add_with_line(x, src.get_line(i).unwrap_or(0) as u16),
        };
        let moved = match ins {
            Instruction::Jump(t) => Instruction::Jump(to(t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(to(t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(to(t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(to(t)),
            Instruction::Iterate(t) => Instruction::Iterate(to(t)),
            Instruction::BuildMacro(name, t, flags) => Instruction::BuildMacro(name, to(t), *flags),
            Instruction::Mul => Instruction::CallFunction(MUL, Some(2)),
            other => other.clone(),
        };
        let built = builds(ins);
        push(moved);
        if let Instruction::EmitRaw(text) = ins {
            push(Instruction::LoadConst(JValue::from(text.len())));
            push(Instruction::CallFunction(WRITTEN, Some(1)));
            push(Instruction::DiscardTop);
        } else if built {
            let count = match ins {
                Instruction::CallFunction(..) | Instruction::CallObject(_) => CALLED,
                _ => BUILT,
            };
            push(Instruction::DupTop);
            push(Instruction::CallFunction(count, Some(1)));
            push(Instruction::DiscardTop);
        }
    }
    out
}

/// Whether an instruction leaves a value it built on the stack.
fn builds(i: &Instruction<'_>) -> bool {
    matches!(
        i,
        Instruction::StringConcat
            | Instruction::Add
            | Instruction::Mul
            | Instruction::BuildList(_)
            | Instruction::BuildMap(_)
            | Instruction::BuildKwargs(_)
            | Instruction::MergeKwargs(_)
            | Instruction::Slice
            | Instruction::ApplyFilter(..)
            | Instruction::CallMethod(..)
            | Instruction::CallObject(_)
    ) || matches!(i, Instruction::CallFunction(name, _) if ![BUILT, CALLED, WRITTEN].contains(name))
}

/// `replace`, as a filter or a method: checked for room first (an empty pattern matches
/// between every two characters).
pub(super) fn check_replace(s: &str, old: &str, new: &str) -> Result<(), minijinja::Error> {
    let matches = if old.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(old).count()
    };
    check_room(
        "`replace`",
        s.len() as u128 + matches as u128 * new.len() as u128,
    )
}

/// `join`, as a filter or a method: checked for room first.
pub(super) fn check_join(items: &JValue, sep: &str) -> Result<(), minijinja::Error> {
    let n = items.len().unwrap_or(0) as u128;
    let texts: u128 = match items.try_iter() {
        Ok(it) => it.map(|x| x.as_str().map_or(32, str::len) as u128).sum(),
        Err(_) => 0,
    };
    check_room("`join`", texts + n * sep.len() as u128)
}

/// `format`, as a filter or a method: a width or precision in the format string (`%99999999s`,
/// `{:>99999999}`) is checked for room first.
pub(super) fn check_format(fmt: &str, args: &[JValue]) -> Result<(), minijinja::Error> {
    let widest = fmt
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|d| d.parse::<u128>().ok())
        .max()
        .unwrap_or(0);
    let args: u128 = args.iter().map(|a| size(a) as u128 + 32).sum();
    check_room(
        "`format`",
        fmt.len() as u128 + args + widest.saturating_mul(args.max(1)),
    )
}

/// The text of an argument, for the checks (a non-string counts as its printed form).
fn text(v: Option<&JValue>) -> String {
    match v {
        Some(v) => v.as_str().map_or_else(|| v.to_string(), str::to_owned),
        None => String::new(),
    }
}

/// A keyword argument (the last argument, when it is one) named `name`.
fn kwarg(args: &[JValue], name: &str) -> Option<JValue> {
    let last = args.last()?;
    (last.kind() == ValueKind::Map)
        .then(|| last.get_attr(name).ok())
        .flatten()
        .filter(|v| !v.is_undefined())
}

/// The `replace` filter's check: `value | replace(old, new)`.
pub(super) fn filter_replace(args: &[JValue]) -> Result<(), minijinja::Error> {
    check_replace(&text(args.first()), &text(args.get(1)), &text(args.get(2)))
}

/// The `join` filter's check: `items | join(sep)`.
pub(super) fn filter_join(args: &[JValue]) -> Result<(), minijinja::Error> {
    let items = args.first().cloned().unwrap_or_default();
    check_join(&items, &text(args.get(1)))
}

/// The `indent` filter's check: `value | indent(width)`, each line indented.
pub(super) fn filter_indent(args: &[JValue]) -> Result<(), minijinja::Error> {
    let s = text(args.first());
    let width = kwarg(args, "width")
        .or_else(|| args.get(1).cloned())
        .and_then(|w| {
            w.as_i64()
                .map(|n| n.max(0) as u128)
                .or_else(|| w.as_str().map(|s| s.len() as u128))
        })
        .unwrap_or(4);
    let lines = s.lines().count() as u128 + 1;
    check_room("`indent`", s.len() as u128 + lines.saturating_mul(width))
}

/// The `format` filter's check: `fmt | format(args…)`.
pub(super) fn filter_format(args: &[JValue]) -> Result<(), minijinja::Error> {
    check_format(&text(args.first()), args.get(1..).unwrap_or_default())
}

/// The `slice` filter's check: `items | slice(count)` makes `count` lists.
pub(super) fn filter_slice(args: &[JValue]) -> Result<(), minijinja::Error> {
    let count = args.get(1).and_then(JValue::as_i64).unwrap_or(0).max(0) as u128;
    check_room("`slice`", count.saturating_mul(16))
}

/// The checks of the Python string methods that can build far more than they are given:
/// `replace`, `join` and `format`, before minijinja-contrib's `pycompat` builds them.
pub(super) fn check_method(
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> Result<(), minijinja::Error> {
    let Some(s) = value.as_str() else {
        return Ok(());
    };
    match method {
        "replace" => check_replace(s, &text(args.first()), &text(args.get(1))),
        "join" => check_join(&args.first().cloned().unwrap_or_default(), s),
        "format" => check_format(s, args),
        _ => Ok(()),
    }
}

/// The largest chat template accepted, in bytes (1 MiB; released ones are at most tens of kB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// The largest value minijinja may fold out of constants when it compiles a template
/// (64 KiB): `{{ 'x' * 99999999 }}` is computed while compiling, before any render's limits
/// apply, and nested folds of such constants have no limit at all.
pub const MAX_FOLDED_BYTES: u128 = 64 << 10;

/// Checks a template's source before minijinja compiles it: its size, and the size of every
/// value its compiler would fold out of constants (`'x' * 99999999`, `'a' ~ 'b'`). The error
/// says what is wrong in one line.
pub(super) fn check_source(source: &str) -> Result<(), String> {
    if source.len() > MAX_TEMPLATE_BYTES {
        return Err(format!(
            "the template is {} bytes; at most {MAX_TEMPLATE_BYTES} are accepted",
            source.len()
        ));
    }
    let ws = minijinja::machinery::WhitespaceConfig {
        keep_trailing_newline: false,
        lstrip_blocks: true,
        trim_blocks: true,
    };
    // A template that does not parse is reported by the compiler, with its location.
    let Ok(ast) = minijinja::machinery::parse(source, "chat", Default::default(), ws) else {
        return Ok(());
    };
    let Ok(tree) = serde_json::to_value(&ast) else {
        return Ok(());
    };
    folded(&tree).map(drop)
}

/// A constant's size as the compiler folds it: a string's bytes, or an integer's value.
#[derive(Clone, Copy)]
enum Folded {
    Str(u128),
    Int(u128),
    Other,
}

/// Walks the parsed template (as JSON): the folded size of `node` when it is a constant
/// expression, refusing any fold over [`MAX_FOLDED_BYTES`].
fn folded(node: &serde_json::Value) -> Result<Option<Folded>, String> {
    use serde_json::Value as J;
    let inner = |n: &J| n.get("inner").and_then(|i| i.get(0)).cloned();
    let children = |n: &J| -> Result<(), String> {
        match n {
            J::Object(m) => m.values().try_for_each(|v| folded(v).map(drop)),
            J::Array(a) => a.iter().try_for_each(|v| folded(v).map(drop)),
            _ => Ok(()),
        }
    };
    let kind = node.get("expr").and_then(J::as_str);
    match kind {
        Some("Const") => {
            let v = inner(node).and_then(|c| c.get("value").cloned());
            Ok(Some(match v {
                Some(J::String(s)) => Folded::Str(s.len() as u128),
                Some(J::Number(n)) => n.as_u64().map_or(Folded::Other, |n| Folded::Int(n as u128)),
                _ => Folded::Other,
            }))
        }
        Some("BinOp") => {
            let Some(b) = inner(node) else {
                return Ok(None);
            };
            let (l, r) = match (b.get("left"), b.get("right")) {
                (Some(l), Some(r)) => (folded(l)?, folded(r)?),
                _ => return Ok(None),
            };
            let (Some(l), Some(r)) = (l, r) else {
                return Ok(None);
            };
            let op = b.get("op").and_then(J::as_str).unwrap_or("");
            let out = match (op, l, r) {
                ("Mul", Folded::Str(s), Folded::Int(n))
                | ("Mul", Folded::Int(n), Folded::Str(s)) => Folded::Str(s.saturating_mul(n)),
                ("Add" | "Concat", Folded::Str(a), Folded::Str(b)) => Folded::Str(a + b),
                ("Concat", Folded::Str(a), _) | ("Concat", _, Folded::Str(a)) => {
                    Folded::Str(a + 32)
                }
                ("Add", Folded::Int(a), Folded::Int(b)) => Folded::Int(a.saturating_add(b)),
                ("Mul", Folded::Int(a), Folded::Int(b)) => Folded::Int(a.saturating_mul(b)),
                ("Pow", Folded::Int(a), Folded::Int(b)) => {
                    Folded::Int(a.checked_pow(b.min(128) as u32).unwrap_or(u128::MAX))
                }
                _ => Folded::Other,
            };
            if let Folded::Str(n) = out
                && n > MAX_FOLDED_BYTES
            {
                return Err(format!(
                    "a constant expression of the template makes a string of {n} bytes when compiled; at most {MAX_FOLDED_BYTES} are accepted"
                ));
            }
            Ok(Some(out))
        }
        Some(_) => {
            children(node)?;
            Ok(None)
        }
        None => {
            children(node)?;
            Ok(None)
        }
    }
}
