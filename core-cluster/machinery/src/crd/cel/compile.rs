//! Parsing one rule without ever overflowing the stack, after cel-go's parser limits
//! (`parser/parser.go`): an expression of more than [`MAX_CODE_POINTS`] code points is
//! refused before it is parsed, and so is one nested deeper than [`MAX_RECURSION_DEPTH`].
//!
//! The `cel` crate's parser (antlr4rust) is recursive descent: in a debug build every level
//! of brackets costs it about 175 KiB of stack, every operator of a chain about 1.5 KiB (a
//! release build: 8 KiB and 0.5 KiB). So a cheap token scan ([`scan`]) first bounds what the
//! parser will nest, with cel-go's two measures and messages:
//!
//! - the parse listener's (`expression recursion limit exceeded: 250`): how deeply the
//!   `expr` grammar rule nests, that is brackets (`(`, `[`, `{`, call arguments, indexes)
//!   and the `else` branches of conditionals;
//! - the visitor's (`max recursion depth exceeded`): the height of the expression tree
//!   counting what cel-go's visitor counts, i.e. relations (`==`, `<`, `in`, ...),
//!   arithmetic, selections, method calls, indexes and conditionals, but not `&&`/`||`
//!   (balanced trees), unary operators, literals, global calls or parentheses.
//!
//! Both are exact for chains and for plain nesting (upstream's `TestCELMaxRecursionDepth`:
//! `self.val1 == ` 249 times then `self.val1` is accepted, 250 times refused). cel-go's
//! listener also counts every other grammar rule separately (an operand nested on the right
//! of a relation counts twice for `relation`), which this scan does not: some rules nested
//! 125-249 levels deep that cel-go refuses are accepted here. The stack below is sized for
//! the scan's bounds, so that is a difference of acceptance, not of safety.
//!
//! The parse then runs on a fresh stack segment of [`PARSE_STACK`] (`stacker`, on the
//! caller's thread: reserved address space, committed only as the parser touches it), and
//! what the interpreter cannot evaluate (it `panic!`s or `todo!()`s on them) is refused:
//! message construction `Foo{a: 1}` (upstream: `undeclared reference to 'Foo'`), and any
//! unspecified expression.

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use kube_cel::cel::parser::Parser;

/// cel-go's `expressionSizeCodePointLimit`.
pub(super) const MAX_CODE_POINTS: usize = 100_000;

/// cel-go's `maxRecursionDepth`.
pub(super) const MAX_RECURSION_DEPTH: u32 = 250;

/// The stack the parser runs on. The deepest rule the scan accepts, 249 nested list
/// literals, needs 43 MiB in a debug build (measured: `lists` and `calls` at 249 levels,
/// 40-43 MiB; chains of 249 operators under 1 MiB) and 2 MiB in a release build.
pub(super) const PARSE_STACK: usize = 64 << 20;

/// A rule that does not compile: cel's `ERROR: <input>:l:c: ...` text, which the caller
/// words as `compilation failed: <text>`.
pub(super) type CompileError = String;

/// cel-go's wording of an error without a location (`common.NoLocation`).
fn unlocated(message: &str) -> CompileError {
    format!("ERROR: <input>:-1:0: {message}")
}

/// `message` at byte `offset` of `src`, with the snippet as the `cel` crate shows its own
/// parse errors.
fn located(src: &str, offset: usize, message: &str) -> CompileError {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    let snippet = src[line_start..].lines().next().unwrap_or("");
    format!(
        "ERROR: <input>:{line}:{column}: {message}\n| {snippet}\n| {:.>column$}",
        "^"
    )
}

/// Parses `src` within cel-go's limits and runs `then` on the expression, both on a stack
/// of [`PARSE_STACK`]: the walks of `then` recurse over the tree as the parser does.
pub(super) fn parse<R>(src: &str, then: impl FnOnce(&IdedExpr) -> R) -> Result<R, CompileError> {
    let size = src.chars().count();
    if size > MAX_CODE_POINTS {
        return Err(unlocated(&format!(
            "expression code point size exceeds limit: size: {size}, limit {MAX_CODE_POINTS}"
        )));
    }
    let scan = scan(src);
    if scan.nesting > MAX_RECURSION_DEPTH {
        return Err(unlocated(&format!(
            "expression recursion limit exceeded: {MAX_RECURSION_DEPTH}"
        )));
    }
    if scan.height > MAX_RECURSION_DEPTH {
        return Err(unlocated("max recursion depth exceeded"));
    }
    stacker::grow(PARSE_STACK, || {
        let parsed = std::panic::catch_unwind(|| {
            // The crate's own listener counts `expr` nesting: a second guard, never reached
            // once the scan has passed.
            Parser::new()
                .max_recursion_depth(MAX_RECURSION_DEPTH as u16)
                .parse(src)
        })
        .map_err(|_| unlocated("internal error parsing the expression"))?
        .map_err(|e| e.to_string())?;
        if let Some(found) = unsupported(&parsed) {
            return Err(match found {
                Unsupported::Message(name) => match scan.message_at {
                    Some(offset) => located(
                        src,
                        offset,
                        &format!("undeclared reference to '{name}' (in container '')"),
                    ),
                    None => unlocated(&format!(
                        "undeclared reference to '{name}' (in container '')"
                    )),
                },
                Unsupported::Unspecified => unlocated("unsupported expression"),
            });
        }
        Ok(then(&parsed))
    })
}

enum Unsupported {
    /// Message (struct) construction, with the message's name.
    Message(String),
    /// An expression the parser left unspecified.
    Unspecified,
}

/// The first construct of `e` the interpreter would `panic!` on.
fn unsupported(e: &IdedExpr) -> Option<Unsupported> {
    find_in(e, |e| match &e.expr {
        Expr::Unspecified => Some(Unsupported::Unspecified),
        Expr::Struct(s) => Some(Unsupported::Message(s.type_name.clone())),
        Expr::Map(m) => m.entries.iter().find_map(|entry| match &entry.expr {
            EntryExpr::StructField(f) => Some(Unsupported::Message(f.field.clone())),
            EntryExpr::MapEntry(_) => None,
        }),
        _ => None,
    })
}

/// The first answer of `visit` over `e` and its subexpressions, depth first, each node
/// before its children (a call's target before its arguments, a map's keys before their
/// values, a comprehension's range, accumulator, condition, step, then result).
pub(super) fn find_in<T>(e: &IdedExpr, mut visit: impl FnMut(&IdedExpr) -> Option<T>) -> Option<T> {
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        if let Some(found) = visit(e) {
            return Some(found);
        }
        match &e.expr {
            Expr::Literal(_) | Expr::Ident(_) | Expr::Unspecified => {}
            Expr::Select(s) => stack.push(&s.operand),
            Expr::Call(c) => {
                stack.extend(c.target.as_deref());
                stack.extend(&c.args);
            }
            Expr::List(l) => stack.extend(&l.elements),
            Expr::Map(m) => {
                for entry in &m.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => stack.extend([&me.key, &me.value]),
                        EntryExpr::StructField(f) => stack.push(&f.value),
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        stack.push(&f.value);
                    }
                }
            }
            Expr::Comprehension(c) => stack.extend([
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]),
        }
    }
    None
}

/// What [`scan`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Scan {
    /// The listener's measure: how deeply `expr` nests (1 for a flat expression).
    pub nesting: u32,
    /// The visitor's measure: the tree height it counts.
    pub height: u32,
    /// The byte offset of the `{` of the first message construction (`Foo{`).
    pub message_at: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    /// An identifier (not a keyword).
    Ident,
    /// A literal: number, string, bytes, `true`, `false`, `null`.
    Literal,
    Open(u8),
    Close,
    Dot,
    Comma,
    Question,
    Colon,
    Not,
    Minus,
    /// Another binary operator, with its precedence (`||` 2, `&&` 3, relations 4,
    /// `+` 5, `*` `/` `%` 6).
    Binary(u8),
}

/// The tokens of `src` with their byte offsets: string literals and comments skipped,
/// unknown characters ignored (the parser reports them).
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let quote_at = |j: usize| j < b.len() && (b[j] == b'"' || b[j] == b'\'');
        // A string or bytes literal, possibly raw and triple-quoted.
        let mut prefix = 0;
        while prefix < 2 && i + prefix < b.len() && b"rRbB".contains(&b[i + prefix]) {
            prefix += 1;
        }
        if quote_at(i + prefix)
            && (prefix == 0 || !is_ident_byte(b.get(i.wrapping_sub(1)).copied(), i))
        {
            let raw = b[i..i + prefix].iter().any(|p| *p == b'r' || *p == b'R');
            let q = b[i + prefix];
            let mut j = i + prefix;
            let triple = j + 2 < b.len() && b[j + 1] == q && b[j + 2] == q;
            j += if triple { 3 } else { 1 };
            loop {
                if j >= b.len() {
                    break;
                }
                if !raw && b[j] == b'\\' {
                    j += 2;
                    continue;
                }
                if triple {
                    if j + 2 < b.len() && b[j] == q && b[j + 1] == q && b[j + 2] == q {
                        j += 3;
                        break;
                    }
                } else if b[j] == q {
                    j += 1;
                    break;
                } else if b[j] == b'\n' {
                    break;
                }
                j += 1;
            }
            out.push((Tok::Literal, start));
            i = j;
            continue;
        }
        match c {
            b' ' | b'\t' | b'\r' | b'\n' | 0x0c => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'`' => {
                // An escaped identifier.
                i += 1;
                while i < b.len() && b[i] != b'`' && b[i] != b'\n' {
                    i += 1;
                }
                i += 1;
                out.push((Tok::Ident, start));
            }
            b'0'..=b'9' => {
                i = number_end(b, i);
                out.push((Tok::Literal, start));
            }
            b'.' if b.get(i + 1).is_some_and(u8::is_ascii_digit)
                && !matches!(
                    out.last(),
                    Some((Tok::Ident | Tok::Literal | Tok::Close, _))
                ) =>
            {
                i = number_end(b, i);
                out.push((Tok::Literal, start));
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                let tok = match &src[start..i] {
                    "true" | "false" | "null" => Tok::Literal,
                    "in" => Tok::Binary(4),
                    _ => Tok::Ident,
                };
                out.push((tok, start));
            }
            _ => {
                let two = b.get(i..i + 2).unwrap_or(&[]);
                let (tok, len) = match two {
                    b"||" => (Tok::Binary(2), 2),
                    b"&&" => (Tok::Binary(3), 2),
                    b"==" | b"!=" | b"<=" | b">=" => (Tok::Binary(4), 2),
                    _ => match c {
                        b'<' | b'>' => (Tok::Binary(4), 1),
                        b'+' => (Tok::Binary(5), 1),
                        b'*' | b'/' | b'%' => (Tok::Binary(6), 1),
                        b'-' => (Tok::Minus, 1),
                        b'!' => (Tok::Not, 1),
                        b'(' | b'[' | b'{' => (Tok::Open(c), 1),
                        b')' | b']' | b'}' => (Tok::Close, 1),
                        b'.' => (Tok::Dot, 1),
                        b',' => (Tok::Comma, 1),
                        b'?' => (Tok::Question, 1),
                        b':' => (Tok::Colon, 1),
                        _ => {
                            // Skip the whole (possibly multi-byte) character.
                            i += src[i..].chars().next().map_or(1, char::len_utf8);
                            continue;
                        }
                    },
                };
                out.push((tok, start));
                i += len;
            }
        }
    }
    out
}

/// Whether the byte before offset `i` continues an identifier (so `xr'a'` is not a raw
/// string): only at `i > 0`.
fn is_ident_byte(before: Option<u8>, i: usize) -> bool {
    i > 0 && before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The end of the number starting at `i` (digits, hex, a fraction, an exponent, `u`).
fn number_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphanumeric() || c == b'.' || c == b'_' {
            let exponent = (c == b'e' || c == b'E')
                && b.get(i + 1).is_some_and(|n| *n == b'+' || *n == b'-')
                && !b[..i].ends_with(b"0x");
            i += if exponent { 2 } else { 1 };
        } else {
            break;
        }
    }
    i
}

/// The precedence of `?` and `:`, the lowest.
const TERNARY: u8 = 1;

/// One bracket level (or the whole expression) being scanned.
#[derive(Debug)]
struct Frame {
    /// The tree height of the operand the bracket applies to and what the bracket adds,
    /// when it is an index or a method call (`x[...]`, `x.f(...)`).
    postfix: Option<u32>,
    /// The operands' heights and the pending operators (shunting-yard), each operator as
    /// its precedence and what it adds to the height.
    operands: Vec<u32>,
    operators: Vec<(u8, u32)>,
    /// The highest of the completed expressions in this bracket (list items, arguments).
    done: u32,
    /// The `else` branches open in the current expression (each nests `expr` once more).
    elses: u32,
    /// The `?` still waiting for their `:`.
    questions: u32,
}

impl Frame {
    fn new(postfix: Option<u32>) -> Frame {
        Frame {
            postfix,
            operands: Vec::new(),
            operators: Vec::new(),
            done: 0,
            elses: 0,
            questions: 0,
        }
    }

    /// Applies the pending operators that bind at least as tightly as one of precedence
    /// `p` about to be pushed (`?` and `:`, precedence 1, are right-associative).
    fn reduce(&mut self, p: u8, max: &mut u32) {
        while let Some(&(top, weight)) = self.operators.last() {
            if top < p || (top == p && p == TERNARY) {
                break;
            }
            self.operators.pop();
            let right = self.operands.pop().unwrap_or(0);
            let left = self.operands.pop().unwrap_or(0);
            let h = left.max(right).saturating_add(weight);
            *max = (*max).max(h);
            self.operands.push(h);
        }
    }

    /// Pushes a binary operator of precedence `p` adding `weight` to the height.
    fn operator(&mut self, p: u8, weight: u32, max: &mut u32) {
        self.reduce(p, max);
        self.operators.push((p, weight));
    }

    /// Ends the current expression (at `,`, a map's `:` or the closing bracket).
    fn finish(&mut self, max: &mut u32) {
        self.reduce(u8::MIN, max);
        let h = self.operands.drain(..).max().unwrap_or(0);
        self.done = self.done.max(h);
        self.operators.clear();
        self.elses = 0;
        self.questions = 0;
    }

    fn push_operand(&mut self, h: u32, max: &mut u32) {
        *max = (*max).max(h);
        self.operands.push(h);
    }

    /// Applies a postfix (select, index, method call) to the last operand.
    fn postfix(&mut self, h: u32, max: &mut u32) {
        let top = self.operands.pop().unwrap_or(0);
        self.push_operand(top.max(h), max);
    }
}

/// cel-go's two recursion measures of `src`, from its tokens alone (see the module
/// documentation). Never recursive, and linear in the input's length.
pub(super) fn scan(src: &str) -> Scan {
    let toks = tokens(src);
    let mut frames = vec![Frame::new(None)];
    let mut height = 0;
    // The listener's measure now (the frames and their open `else` branches), and its most.
    let mut current: u32 = 1;
    let mut nesting = 1;
    let mut message_at = None;
    // Whether the previous token ended an operand (so `-` and `[` are binary / index).
    let mut after_operand = false;
    let mut i = 0;
    while i < toks.len() {
        let tok = toks[i].0;
        let next = toks.get(i + 1).map(|t| t.0);
        let frame = frames.last_mut().expect("the outer frame is never popped");
        match tok {
            Tok::Ident | Tok::Literal => {
                if tok == Tok::Ident && next == Some(Tok::Open(b'(')) {
                    // A global call: the visitor does not count it.
                    frames.push(Frame::new(Some(0)));
                    current = current.saturating_add(1);
                    nesting = nesting.max(current);
                    i += 2;
                    after_operand = false;
                    continue;
                }
                if tok == Tok::Ident && next == Some(Tok::Open(b'{')) {
                    message_at.get_or_insert(toks[i + 1].1);
                }
                frame.push_operand(0, &mut height);
                after_operand = true;
            }
            Tok::Dot => {
                if after_operand {
                    if next == Some(Tok::Ident)
                        && toks.get(i + 2).map(|t| t.0) == Some(Tok::Open(b'('))
                    {
                        let base = frame.operands.pop().unwrap_or(0);
                        frames.push(Frame::new(Some(base.saturating_add(1))));
                        current = current.saturating_add(1);
                        nesting = nesting.max(current);
                        i += 3;
                        after_operand = false;
                        continue;
                    }
                    if next == Some(Tok::Ident) {
                        let top = frame.operands.last().copied().unwrap_or(0);
                        frame.postfix(top.saturating_add(1), &mut height);
                        i += 2;
                        // `a.b{` is a message construction too.
                        if toks.get(i).map(|t| t.0) == Some(Tok::Open(b'{')) {
                            message_at.get_or_insert(toks[i].1);
                        }
                        continue;
                    }
                }
                // A leading dot (`.name`): nothing to count.
            }
            Tok::Open(c) => {
                let postfix = if c == b'[' && after_operand {
                    let base = frame.operands.pop().unwrap_or(0);
                    Some(base.saturating_add(1))
                } else {
                    if after_operand {
                        // `x{` or `x(` after an operand: a message or a syntax error.
                        frame.operands.pop();
                    }
                    None
                };
                frames.push(Frame::new(postfix));
                current = current.saturating_add(1);
                nesting = nesting.max(current);
                after_operand = false;
            }
            Tok::Close => {
                if frames.len() > 1 {
                    let mut inner = frames.pop().expect("checked");
                    current = current.saturating_sub(1 + inner.elses);
                    inner.finish(&mut height);
                    let h = match inner.postfix {
                        Some(base) => base.max(inner.done.saturating_add(u32::from(base > 0))),
                        None => inner.done,
                    };
                    let outer = frames.last_mut().expect("checked");
                    outer.push_operand(h, &mut height);
                    after_operand = true;
                }
            }
            Tok::Comma => {
                current = current.saturating_sub(frame.elses);
                frame.finish(&mut height);
                after_operand = false;
            }
            Tok::Question => {
                // The visitor counts a conditional once, at its `?`.
                frame.operator(TERNARY, 1, &mut height);
                frame.questions += 1;
                after_operand = false;
            }
            Tok::Colon => {
                if frame.questions > 0 {
                    frame.operator(TERNARY, 0, &mut height);
                    frame.questions -= 1;
                    frame.elses += 1;
                    current = current.saturating_add(1);
                    nesting = nesting.max(current);
                } else {
                    // A map entry's key ends.
                    current = current.saturating_sub(frame.elses);
                    frame.finish(&mut height);
                }
                after_operand = false;
            }
            Tok::Not => after_operand = false,
            Tok::Minus if !after_operand => {}
            Tok::Minus => {
                frame.operator(5, 1, &mut height);
                after_operand = false;
            }
            Tok::Binary(p) => {
                // `||` and `&&` build balanced trees the visitor does not count.
                frame.operator(p, u32::from(p > 3), &mut height);
                after_operand = false;
            }
        }
        i += 1;
    }
    while let Some(mut frame) = frames.pop() {
        frame.finish(&mut height);
    }
    Scan {
        nesting,
        height,
        message_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measures(src: &str) -> (u32, u32) {
        let s = scan(src);
        (s.nesting, s.height)
    }

    /// cel-go's listener counts `expr` nesting (1 for a flat expression) and its visitor the
    /// chain of relations, arithmetic and selections.
    #[test]
    fn the_scan_measures_nesting_and_chains_as_cel_go() {
        assert_eq!(measures("true"), (1, 0));
        assert_eq!(measures("((((((((((true))))))))))"), (11, 0));
        assert_eq!(measures("self.a"), (1, 1));
        assert_eq!(measures("self.val1 == self.val1"), (1, 2));
        assert_eq!(measures("1 + 2 * 3 > 0"), (1, 3));
        assert_eq!(measures("a && b || c && d"), (1, 0));
        assert_eq!(measures("self.l.all(x, x > 0)"), (2, 2));
        assert_eq!(measures("[1, [2, [3]]]"), (4, 0));
        assert_eq!(measures("a ? b : c ? d : e"), (3, 2));
        assert_eq!(measures("self.m['k'].size()"), (2, 3));
        assert_eq!(measures("-1 - -2"), (1, 1));
        assert_eq!(measures("!has(self.a)"), (2, 1));
    }

    /// String literals and comments hide their brackets and operators from the scan.
    #[test]
    fn the_scan_skips_strings_and_comments() {
        assert_eq!(measures("'((((' + \"]]\" // ((((\n"), (1, 1));
        assert_eq!(measures("r'\\' == b'\\''"), (1, 1));
        assert_eq!(measures("'''a'b)(''' == \"\"\"x\"\"\""), (1, 1));
        assert_eq!(measures("1e-5 > 0.5 && .5 < 2u"), (1, 1));
    }

    /// `Foo{a: 1}` is found with the offset of its `{`.
    #[test]
    fn the_scan_finds_message_construction() {
        assert_eq!(scan("Foo{a: 1}").message_at, Some(3));
        assert_eq!(scan("a.b.C{}").message_at, Some(5));
        assert_eq!(scan("{'a': 1}").message_at, None);
        assert_eq!(scan("x in {'a': 1}").message_at, None);
    }
}
