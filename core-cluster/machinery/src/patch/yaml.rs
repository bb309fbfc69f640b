//! Decoding YAML apply bodies with bounded cost.
//!
//! `serde_norway` parses a whole document (libyaml) before it hands out the first value, and
//! libyaml's scanner walks every open flow collection (`[`, `{`) for every token it reads,
//! so a body of nested flow collections (`[[[[...]]]]`) costs time quadratic in its depth:
//! 312 KB took minutes. kube-apiserver's YAML decoder stops at 10,000 levels
//! (`exceeded max depth`); nothing nested past [`MAX_DEPTH`] can be stored here anyway, so
//! [`check_nesting`] refuses a deeper document before the parser sees it, in one linear
//! pass.
//!
//! The pass runs libyaml's own tokenizer rules (the scanner of `unsafe-libyaml-norway`,
//! which `serde_norway` uses): where each token starts, what ends plain, quoted and block
//! scalars, which `[` and `]` are flow indicators and which are scalar text, the block
//! indentation stack. Where libyaml would stop with a scanner error the pass goes on, so its
//! depth is never below the depth libyaml reaches; for every document libyaml accepts the
//! two agree.
//!
//! [`decode`] then builds the value through a node budget, which bounds what aliases can
//! expand to (a 20 KB "billion laughs" body otherwise grows past any memory): the body's
//! length plus [`ALIAS_ALLOWANCE`] nodes, as kube-apiserver's decoder refuses a document
//! with "excessive aliasing". The budget is also where a cancelled request stops: the flag
//! is read at every node.

use std::{
    cell::Cell,
    fmt,
    sync::atomic::{AtomicBool, Ordering},
};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::limits::MAX_DEPTH;

/// How many more values than its length in bytes a document may decode to through aliases
/// (kube-apiserver's YAML decoder allows about 400,000 alias-driven decodes).
pub const ALIAS_ALLOWANCE: usize = 400_000;

/// Why a YAML body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// Collections nest deeper than [`MAX_DEPTH`].
    #[error("the document nests deeper than {MAX_DEPTH} levels of collections")]
    TooDeep,
    /// Aliases expand the document past its node budget.
    #[error("the document contains excessive aliasing")]
    ExcessiveAliasing,
    /// A UTF-16 body is not valid UTF-16.
    #[error("the document is not valid UTF-16")]
    BadUtf16,
    /// The request was abandoned while its body was being decoded.
    #[error("the request was cancelled")]
    Cancelled,
    /// libyaml refused the document: the message as go-yaml words it (`yaml: line N:
    /// <problem>`), which kube-apiserver's answer quotes.
    #[error("{0}")]
    Syntax(String),
}

/// A libyaml error as go-yaml's `parser.fail` words it: `yaml: line N: <problem>`, where N
/// is the 0-based line of the error's context if that is not 0, else the 0-based line of
/// the problem (one more for a scanner's error, which has not moved past its line), and no
/// line at all when both are 0. `message` is libyaml's as `serde_norway` displays it:
/// `<problem> at line L column C[, while <context> at line L2 column C2]`, lines 1-based.
/// A message of another form is kept as it is, after `yaml: `.
pub fn go_yaml_message(message: &str) -> String {
    fn mark(text: &str) -> Option<(&str, usize)> {
        let (before, after) = text.rsplit_once(" at line ")?;
        let line = after.split(' ').next()?.parse().ok()?;
        Some((before, line))
    }
    let (problem_part, context) = match message.split_once(", while ") {
        Some((problem, context)) => (problem, Some(context)),
        None => (message, None),
    };
    let Some((problem, problem_line)) = mark(problem_part) else {
        return format!("yaml: {message}");
    };
    // The scanner's errors: those with a "while scanning" context, and the two it raises
    // without one.
    let scanner = context.is_some_and(|c| c.starts_with("scanning"))
        || problem.ends_with("are not allowed in this context");
    let context_line = context
        .and_then(mark)
        .map_or(0, |(_, line)| line.saturating_sub(1));
    let problem_line = problem_line.saturating_sub(1);
    let line = if context_line != 0 {
        context_line + usize::from(scanner)
    } else if problem_line != 0 {
        problem_line + usize::from(scanner)
    } else {
        0
    };
    if line == 0 {
        format!("yaml: {problem}")
    } else {
        format!("yaml: line {line}: {problem}")
    }
}

/// Decodes one YAML document into a JSON value: a UTF-16 body (with its byte order mark) is
/// read as libyaml reads it, nesting past [`MAX_DEPTH`] is refused before parsing
/// ([`check_nesting`]), and the decoded value may hold at most `body.len()` plus
/// [`ALIAS_ALLOWANCE`] nodes. `cancelled` is read at every node: once it is set, decoding
/// stops with [`YamlError::Cancelled`].
pub fn decode(body: &[u8], cancelled: &AtomicBool) -> Result<Value, YamlError> {
    let transcoded;
    let body = match utf16_to_utf8(body) {
        Some(text) => {
            transcoded = text?;
            transcoded.as_bytes()
        }
        None => body,
    };
    check_nesting(body)?;
    let budget = Budget {
        left: Cell::new(body.len().saturating_add(ALIAS_ALLOWANCE)),
        exhausted: Cell::new(false),
        cancelled,
    };
    let deserializer = serde_norway::Deserializer::from_slice(body);
    ValueSeed(&budget).deserialize(deserializer).map_err(|e| {
        if cancelled.load(Ordering::Relaxed) {
            YamlError::Cancelled
        } else if budget.exhausted.get() {
            YamlError::ExcessiveAliasing
        } else {
            YamlError::Syntax(go_yaml_message(&e.to_string()))
        }
    })
}

/// A body that starts with a UTF-16 byte order mark, as UTF-8 (libyaml detects the
/// encoding from it); `None` for any other body.
fn utf16_to_utf8(body: &[u8]) -> Option<Result<String, YamlError>> {
    let little = match body {
        [0xFF, 0xFE, ..] => true,
        [0xFE, 0xFF, ..] => false,
        _ => return None,
    };
    let units = body[2..].chunks(2).map(|pair| match (pair, little) {
        ([a, b], true) => Ok(u16::from_le_bytes([*a, *b])),
        ([a, b], false) => Ok(u16::from_be_bytes([*a, *b])),
        _ => Err(YamlError::BadUtf16),
    });
    let mut out = String::with_capacity(body.len());
    let mut pending = Ok(());
    let units = units.map_while(|u| match u {
        Ok(u) => Some(u),
        Err(e) => {
            pending = Err(e);
            None
        }
    });
    for c in char::decode_utf16(units) {
        match c {
            Ok(c) => out.push(c),
            Err(_) => return Some(Err(YamlError::BadUtf16)),
        }
    }
    Some(pending.map(|()| out))
}

// ------------------------------------------------------------------ the nesting pre-scan

/// Refuses a document whose block and flow collections nest deeper than [`MAX_DEPTH`] at
/// any point, as libyaml's scanner would open them. Linear in the body's length.
pub fn check_nesting(body: &[u8]) -> Result<(), YamlError> {
    if max_nesting(body, MAX_DEPTH) > MAX_DEPTH {
        return Err(YamlError::TooDeep);
    }
    Ok(())
}

/// The deepest nesting of open collections (block collections on the indentation stack plus
/// flow collections) libyaml's scanner reaches in `body`, counted until it passes `limit`
/// (then `limit + 1`).
pub fn max_nesting(body: &[u8], limit: usize) -> usize {
    let mut scanner = Scanner::new(body);
    scanner.run(limit);
    scanner.deepest
}

/// A possible simple key (a scalar or collection that a later `:` may turn into a key).
#[derive(Clone, Copy, Default)]
struct SimpleKey {
    possible: bool,
    index: usize,
    line: usize,
    column: usize,
}

/// libyaml's scanner state, without the tokens: position, flow level, simple keys and the
/// block indentation stack.
struct Scanner<'a> {
    b: &'a [u8],
    /// Byte offset (libyaml's `mark.index`).
    pos: usize,
    line: usize,
    /// In characters, as libyaml counts columns.
    column: usize,
    flow: usize,
    simple_key_allowed: bool,
    /// One per flow level, plus the block level's.
    simple_keys: Vec<SimpleKey>,
    indent: isize,
    indents: Vec<isize>,
    deepest: usize,
}

const URI_PUNCTUATION: &[u8] = b";/?:@&=+$.%!~*'()";

impl<'a> Scanner<'a> {
    fn new(b: &'a [u8]) -> Self {
        Scanner {
            b,
            pos: 0,
            line: 0,
            column: 0,
            flow: 0,
            simple_key_allowed: true,
            simple_keys: vec![SimpleKey::default()],
            indent: -1,
            indents: Vec::new(),
            deepest: 0,
        }
    }

    /// The byte `offset` bytes ahead, `0` past the end (libyaml's buffer ends in NUL, and a
    /// NUL in the input stops its reader).
    fn at(&self, offset: usize) -> u8 {
        self.b.get(self.pos + offset).copied().unwrap_or(0)
    }

    fn is(&self, offset: usize, c: u8) -> bool {
        self.at(offset) == c
    }

    fn is_z(&self, offset: usize) -> bool {
        self.at(offset) == 0
    }

    fn is_blank(&self, offset: usize) -> bool {
        matches!(self.at(offset), b' ' | b'\t')
    }

    fn is_break(&self, offset: usize) -> bool {
        match self.at(offset) {
            b'\r' | b'\n' => true,
            0xC2 => self.at(offset + 1) == 0x85,
            0xE2 => self.at(offset + 1) == 0x80 && matches!(self.at(offset + 2), 0xA8 | 0xA9),
            _ => false,
        }
    }

    fn is_breakz(&self, offset: usize) -> bool {
        self.is_break(offset) || self.is_z(offset)
    }

    fn is_blankz(&self, offset: usize) -> bool {
        self.is_blank(offset) || self.is_breakz(offset)
    }

    fn is_alpha(&self, offset: usize) -> bool {
        let c = self.at(offset);
        c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
    }

    /// A document marker (`---` or `...` at column 0, then a blank or the end).
    fn at_document_indicator(&self) -> bool {
        self.column == 0
            && ((self.is(0, b'-') && self.is(1, b'-') && self.is(2, b'-'))
                || (self.is(0, b'.') && self.is(1, b'.') && self.is(2, b'.')))
            && self.is_blankz(3)
    }

    /// libyaml's `SKIP`: one character (never less than one byte, so a stray byte cannot
    /// stall the pass).
    fn skip(&mut self) {
        let lead = self.at(0);
        let width = match lead {
            _ if lead & 0x80 == 0 => 1,
            _ if lead & 0xE0 == 0xC0 => 2,
            _ if lead & 0xF0 == 0xE0 => 3,
            _ if lead & 0xF8 == 0xF0 => 4,
            _ => 1,
        };
        self.pos = (self.pos + width).min(self.b.len().max(self.pos + 1));
        self.column += 1;
    }

    /// libyaml's `SKIP_LINE` (and `READ_LINE`): one line break, `\r\n` counting as one.
    fn skip_line(&mut self) {
        if self.is(0, b'\r') && self.is(1, b'\n') {
            self.pos += 2;
        } else if self.is_break(0) {
            self.pos += match self.at(0) {
                b'\r' | b'\n' => 1,
                0xC2 => 2,
                _ => 3,
            };
        } else {
            return;
        }
        self.column = 0;
        self.line += 1;
    }

    fn note_depth(&mut self) {
        self.deepest = self.deepest.max(self.indents.len() + self.flow);
    }

    fn roll_indent(&mut self, column: usize) {
        let column = column as isize;
        if self.flow == 0 && self.indent < column {
            self.indents.push(self.indent);
            self.indent = column;
            self.note_depth();
        }
    }

    fn unroll_indent(&mut self, column: isize) {
        if self.flow != 0 {
            return;
        }
        while self.indent > column {
            self.indent = self.indents.pop().unwrap_or(-1);
        }
    }

    fn top_key(&mut self) -> &mut SimpleKey {
        if self.simple_keys.is_empty() {
            self.simple_keys.push(SimpleKey::default());
        }
        let last = self.simple_keys.len() - 1;
        &mut self.simple_keys[last]
    }

    fn save_simple_key(&mut self) {
        if self.simple_key_allowed {
            let key = SimpleKey {
                possible: true,
                index: self.pos,
                line: self.line,
                column: self.column,
            };
            *self.top_key() = key;
        }
    }

    fn remove_simple_key(&mut self) {
        self.top_key().possible = false;
    }

    /// Whether the innermost simple key is still possible here. libyaml marks keys stale
    /// (a later line, or more than 1024 bytes on) before every token; staleness only grows
    /// with the position, so asking when the key is about to be used is the same.
    fn top_key_possible(&mut self) -> bool {
        let (pos, line) = (self.pos, self.line);
        let key = self.top_key();
        if key.possible && (key.line < line || key.index + 1024 < pos) {
            key.possible = false;
        }
        key.possible
    }

    /// Scans to the end (or until the nesting passes `limit`).
    fn run(&mut self, limit: usize) {
        loop {
            self.scan_to_next_token();
            self.unroll_indent(self.column as isize);
            if self.is_z(0) && self.pos >= self.b.len() {
                return;
            }
            if self.is_z(0) {
                // A NUL byte: libyaml's reader refuses control characters, so it never
                // reads past here.
                return;
            }
            self.fetch_next_token();
            if self.deepest > limit {
                self.deepest = limit + 1;
                return;
            }
        }
    }

    fn scan_to_next_token(&mut self) {
        loop {
            if self.column == 0 && self.is(0, 0xEF) && self.is(1, 0xBB) && self.is(2, 0xBF) {
                self.skip();
            }
            while self.is(0, b' ')
                || ((self.flow != 0 || !self.simple_key_allowed) && self.is(0, b'\t'))
            {
                self.skip();
            }
            if self.is(0, b'#') {
                while !self.is_breakz(0) {
                    self.skip();
                }
            }
            if !self.is_break(0) {
                break;
            }
            self.skip_line();
            if self.flow == 0 {
                self.simple_key_allowed = true;
            }
        }
    }

    fn fetch_next_token(&mut self) {
        let c = self.at(0);
        if self.column == 0 && c == b'%' {
            // A directive takes the rest of its line.
            self.unroll_indent(-1);
            self.remove_simple_key();
            self.simple_key_allowed = false;
            while !self.is_breakz(0) {
                self.skip();
            }
            return;
        }
        if self.at_document_indicator() {
            self.unroll_indent(-1);
            self.remove_simple_key();
            self.simple_key_allowed = false;
            self.skip();
            self.skip();
            self.skip();
            return;
        }
        match c {
            b'[' | b'{' => {
                self.save_simple_key();
                self.simple_keys.push(SimpleKey::default());
                self.flow += 1;
                self.note_depth();
                self.simple_key_allowed = true;
                self.skip();
            }
            b']' | b'}' => {
                self.remove_simple_key();
                if self.flow != 0 {
                    self.flow -= 1;
                    self.simple_keys.pop();
                }
                self.simple_key_allowed = false;
                self.skip();
            }
            b',' => {
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.skip();
            }
            b'-' if self.is_blankz(1) => {
                if self.flow == 0 {
                    self.roll_indent(self.column);
                }
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.skip();
            }
            b'?' if self.flow != 0 || self.is_blankz(1) => {
                if self.flow == 0 {
                    self.roll_indent(self.column);
                }
                self.remove_simple_key();
                self.simple_key_allowed = self.flow == 0;
                self.skip();
            }
            b':' if self.flow != 0 || self.is_blankz(1) => {
                if self.top_key_possible() {
                    let column = self.top_key().column;
                    self.roll_indent(column);
                    self.top_key().possible = false;
                    self.simple_key_allowed = false;
                } else {
                    if self.flow == 0 {
                        self.roll_indent(self.column);
                    }
                    self.simple_key_allowed = self.flow == 0;
                }
                self.skip();
            }
            b'*' | b'&' => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.skip();
                while self.is_alpha(0) {
                    self.skip();
                }
            }
            b'!' => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.scan_tag();
            }
            b'|' | b'>' if self.flow == 0 => {
                self.remove_simple_key();
                self.simple_key_allowed = true;
                self.scan_block_scalar();
            }
            b'\'' | b'"' => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.scan_flow_scalar(c == b'\'');
            }
            _ if self.plain_scalar_starts() => {
                self.save_simple_key();
                self.simple_key_allowed = false;
                self.scan_plain_scalar();
            }
            // "found character that cannot start any token": libyaml stops; going on can
            // only find more nesting.
            _ => self.skip(),
        }
    }

    fn plain_scalar_starts(&self) -> bool {
        let c = self.at(0);
        let indicator = self.is_blankz(0) || b"-?:,[]{}#&*!|>'\"%@`".contains(&c);
        !indicator
            || (c == b'-' && !self.is_blank(1))
            || (self.flow == 0 && (c == b'?' || c == b':') && !self.is_blankz(1))
    }

    fn is_uri_char(&self, verbatim: bool) -> bool {
        let c = self.at(0);
        self.is_alpha(0)
            || URI_PUNCTUATION.contains(&c)
            || (verbatim && matches!(c, b',' | b'[' | b']'))
    }

    /// `!<verbatim>`, `!handle!suffix`, `!suffix`: all on one line, of URI characters
    /// (`[`, `]` and `,` only in the verbatim form).
    fn scan_tag(&mut self) {
        self.skip();
        if self.is(0, b'<') {
            self.skip();
            while self.is_uri_char(true) {
                self.skip();
            }
            if self.is(0, b'>') {
                self.skip();
            }
        } else {
            while self.is_uri_char(false) {
                self.skip();
            }
        }
    }

    /// `|` or `>`: the header, then every line indented at least as far as the content's
    /// indentation (explicit, or that of its first non-empty line), and empty lines.
    fn scan_block_scalar(&mut self) {
        self.skip();
        let mut increment = 0isize;
        if self.is(0, b'+') || self.is(0, b'-') {
            self.skip();
            if self.at(0).is_ascii_digit() {
                increment = isize::from(self.at(0) - b'0');
                self.skip();
            }
        } else if self.at(0).is_ascii_digit() {
            increment = isize::from(self.at(0) - b'0');
            self.skip();
            if self.is(0, b'+') || self.is(0, b'-') {
                self.skip();
            }
        }
        while self.is_blank(0) {
            self.skip();
        }
        if self.is(0, b'#') {
            while !self.is_breakz(0) {
                self.skip();
            }
        }
        if !self.is_breakz(0) {
            // "did not find expected comment or line break": libyaml stops.
            return;
        }
        self.skip_line();
        let mut indent = if increment != 0 {
            if self.indent >= 0 {
                self.indent + increment
            } else {
                increment
            }
        } else {
            0
        };
        if !self.block_scalar_breaks(&mut indent) {
            return;
        }
        while self.column as isize == indent && !self.is_z(0) {
            while !self.is_breakz(0) {
                self.skip();
            }
            self.skip_line();
            if !self.block_scalar_breaks(&mut indent) {
                return;
            }
        }
    }

    /// libyaml's `yaml_parser_scan_block_scalar_breaks`: empty lines and the indentation of
    /// the next one; decides the content's indentation if it is not known yet. `false` where
    /// libyaml stops (a tab in the indentation).
    fn block_scalar_breaks(&mut self, indent: &mut isize) -> bool {
        let mut max_indent = 0isize;
        loop {
            while (*indent == 0 || (self.column as isize) < *indent) && self.is(0, b' ') {
                self.skip();
            }
            max_indent = max_indent.max(self.column as isize);
            if (*indent == 0 || (self.column as isize) < *indent) && self.is(0, b'\t') {
                return false;
            }
            if !self.is_break(0) {
                break;
            }
            self.skip_line();
        }
        if *indent == 0 {
            *indent = max_indent.max(self.indent + 1).max(1);
        }
        true
    }

    /// A single- or double-quoted scalar, which may span lines.
    fn scan_flow_scalar(&mut self, single: bool) {
        let quote = if single { b'\'' } else { b'"' };
        self.skip();
        loop {
            if self.at_document_indicator() || self.is_z(0) {
                // "unexpected document indicator" / "unexpected end of stream".
                return;
            }
            while !self.is_blankz(0) {
                if single && self.is(0, b'\'') && self.is(1, b'\'') {
                    self.skip();
                    self.skip();
                    continue;
                }
                if self.is(0, quote) {
                    break;
                }
                if !single && self.is(0, b'\\') && self.is_break(1) {
                    self.skip();
                    self.skip_line();
                    break;
                }
                if !single && self.is(0, b'\\') {
                    // An escape: the hexadecimal digits of `\x`, `\u` and `\U` that follow
                    // are scanned as text, which they cannot end.
                    self.skip();
                }
                self.skip();
            }
            if self.is(0, quote) {
                self.skip();
                return;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    self.skip();
                } else {
                    self.skip_line();
                }
            }
        }
    }

    /// A plain scalar: words separated by blanks, continued on more indented lines in the
    /// block context; ends at `: `, ` #`, a document marker, and in flow context at `,[]{}`.
    fn scan_plain_scalar(&mut self) {
        let indent = self.indent + 1;
        let mut leading_blanks = false;
        loop {
            if self.at_document_indicator() || self.is(0, b'#') {
                break;
            }
            while !self.is_blankz(0) {
                let c = self.at(0);
                if self.flow != 0 && c == b':' && b",?[]{}".contains(&self.at(1)) {
                    // "found unexpected ':'": libyaml stops.
                    return;
                }
                if (c == b':' && self.is_blankz(1)) || (self.flow != 0 && b",[]{}".contains(&c)) {
                    break;
                }
                self.skip();
            }
            if !(self.is_blank(0) || self.is_break(0)) {
                break;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    self.skip();
                } else {
                    self.skip_line();
                    leading_blanks = true;
                }
            }
            if self.flow == 0 && (self.column as isize) < indent {
                break;
            }
        }
        if leading_blanks {
            self.simple_key_allowed = true;
        }
    }
}

// ------------------------------------------------------------------ the budgeted value

/// The nodes a document may still decode to, and the request's cancellation flag.
struct Budget<'c> {
    left: Cell<usize>,
    exhausted: Cell<bool>,
    cancelled: &'c AtomicBool,
}

impl Budget<'_> {
    fn take<E: de::Error>(&self) -> Result<(), E> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(E::custom("the request was cancelled"));
        }
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.exhausted.set(true);
                Err(E::custom("the document contains excessive aliasing"))
            }
        }
    }
}

/// Deserializes a `serde_json::Value` as its own `Deserialize` does, counting every node
/// against the budget.
#[derive(Clone, Copy)]
struct ValueSeed<'b, 'c>(&'b Budget<'c>);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.0.take()?;
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_i128<E: de::Error>(self, value: i128) -> Result<Value, E> {
        use serde::Deserialize;
        Number::deserialize(de::value::I128Deserializer::<E>::new(value)).map(Value::Number)
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u128<E: de::Error>(self, value: u128) -> Result<Value, E> {
        use serde::Deserialize;
        Number::deserialize(de::value::U128Deserializer::<E>::new(value)).map(Value::Number)
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        Ok(Number::from_f64(value).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(yaml: &str) -> Result<Value, YamlError> {
        decode(yaml.as_bytes(), &AtomicBool::new(false))
    }

    fn nesting(yaml: &str) -> usize {
        max_nesting(yaml.as_bytes(), usize::MAX - 1)
    }

    /// go-yaml's `parser.fail`: the context's line if not the first, else the problem's.
    #[test]
    fn syntax_errors_are_worded_as_go_yaml_words_them() {
        let Err(YamlError::Syntax(message)) = decoded("a: [1, 2\n") else {
            panic!("not a syntax error")
        };
        assert_eq!(message, "yaml: line 1: did not find expected ',' or ']'");
        assert_eq!(
            go_yaml_message("mapping values are not allowed in this context at line 3 column 9"),
            "yaml: line 3: mapping values are not allowed in this context"
        );
        assert_eq!(go_yaml_message("something else"), "yaml: something else");
    }

    /// Everyday manifests decode exactly as `serde_norway` decodes them.
    #[test]
    fn ordinary_documents_decode_as_serde_norway_does() {
        for yaml in [
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels: {a: b, c: \"d\"}\ndata:\n  a: \"1\"\n  script: |\n    if [ -f x ]; then\n      echo '[['\n    fi\n",
            "a: [1, -2, 3.5, 1e400, 0x1F, true, ~, null, 'q''s', \"\\u00e9\"]\n",
            "- &a {x: 1}\n- *a\n- !!str 12\n- ? complex\n  : value\n",
            "{\"json\": [\"style\", {\"nested\": null}]}",
            "%YAML 1.1\n---\nfolded: >\n  one\n  two\n\nplain: multi\n  line [not a flow\n",
        ] {
            let want = serde_norway::from_str::<Value>(yaml).unwrap();
            assert_eq!(decoded(yaml).unwrap(), want, "{yaml}");
        }
    }

    #[test]
    fn nesting_counts_flow_and_block_collections_as_libyaml_opens_them() {
        assert_eq!(nesting("a: [[[1]]]"), 4);
        assert_eq!(nesting("a:\n  b:\n    c: [1]\n"), 4);
        assert_eq!(nesting("- - - x\n"), 3);
        // Brackets inside scalars open nothing.
        assert_eq!(nesting("a: '[[[['\nb: \"{{{\"\nc: x[[[\nd: |\n  [[[[\n"), 1);
        // A quote inside a plain scalar starts nothing: the brackets after it are real.
        assert_eq!(nesting("a: [x \"y, [[[1]]]]\n"), 5);
        // A plain scalar continued on the next line hides a quote from the scanner.
        assert_eq!(nesting("k: foo\n  \"bar\nk2: [[[1]]]\nx: \"\n"), 4);
        // A block scalar ends where a line is indented less than its content.
        assert_eq!(nesting("- key: |\n    text\n  other: [[[1]]]\n"), 5);
    }

    /// kube-apiserver refuses "exceeded max depth"; here nothing past MAX_DEPTH could be
    /// stored, and the refusal comes before libyaml's quadratic scan.
    #[test]
    fn deep_flow_nesting_is_refused_before_parsing() {
        let n = 400_000;
        let deep = format!("a: {}{}", "[".repeat(n), "]".repeat(n));
        let started = tokio::time::Instant::now();
        assert_eq!(decoded(&deep).unwrap_err(), YamlError::TooDeep);
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
        let deep_block = format!("{}x\n", "- ".repeat(MAX_DEPTH + 1));
        assert_eq!(decoded(&deep_block).unwrap_err(), YamlError::TooDeep);
        let ok = format!(
            "a: {}{}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(decoded(&ok).is_ok());
    }

    /// kube-apiserver's decoder: "document contains excessive aliasing".
    #[test]
    fn alias_expansion_is_bounded() {
        let mut yaml = format!("a: &a [{}]\n", vec!["x"; 10_000].join(","));
        let mut previous = "a".to_owned();
        for name in ["b", "c", "d", "e", "f"] {
            yaml.push_str(&format!(
                "{name}: &{name} [{}]\n",
                vec![format!("*{previous}"); 10].join(",")
            ));
            previous = name.to_owned();
        }
        assert_eq!(decoded(&yaml).unwrap_err(), YamlError::ExcessiveAliasing);
        // A few aliases are fine.
        assert_eq!(
            decoded("a: &a [1, 2]\nb: *a\n").unwrap(),
            json!({"a": [1, 2], "b": [1, 2]})
        );
    }

    #[test]
    fn a_cancelled_decode_stops() {
        let yaml = format!("a: [{}]\n", vec!["1"; 1000].join(","));
        assert_eq!(
            decode(yaml.as_bytes(), &AtomicBool::new(true)).unwrap_err(),
            YamlError::Cancelled
        );
    }

    #[test]
    fn utf16_bodies_are_read_as_libyaml_reads_them() {
        let text = "a: [1, 2]\n";
        let mut le = vec![0xFF, 0xFE];
        le.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        assert_eq!(
            decode(&le, &AtomicBool::new(false)).unwrap(),
            json!({"a": [1, 2]})
        );
        let mut deep = vec![0xFE, 0xFF];
        let nested = format!("a: {}{}", "[".repeat(200), "]".repeat(200));
        deep.extend(nested.encode_utf16().flat_map(u16::to_be_bytes));
        assert_eq!(
            decode(&deep, &AtomicBool::new(false)).unwrap_err(),
            YamlError::TooDeep
        );
        assert_eq!(
            decode(&[0xFF, 0xFE, 0x00, 0xD8], &AtomicBool::new(false)).unwrap_err(),
            YamlError::BadUtf16
        );
    }

    /// A small deterministic generator (xorshift), so the property test needs no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    const PIECES: &[&str] = &[
        "[", "]", "{", "}", ",", ":", ": ", "- ", "? ", "#", " #c", "'", "''", "\"", "\\\"", "\\",
        "\n", "\n  ", "\n    ", " ", "\t", "a", "b:", "|", "|2", ">-", "&x ", "*x", "!t ",
        "!<[x]> ", "---\n", "...\n", "%Y\n", "x'y", "é", "\r\n", "1",
    ];

    /// The pre-scan never sees less nesting than libyaml: whenever `serde_norway` reaches
    /// its recursion limit, the scan saw the deep part too; and on every document it
    /// accepts, the scan sees no more nesting than the value has.
    #[test]
    fn the_scan_agrees_with_libyaml_on_random_documents() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let deep = format!("{}x{}", "[".repeat(150), "]".repeat(150));
        for round in 0..6_000 {
            let prefix: String = (0..rng.next() % 12).map(|_| rng.pick(PIECES)).collect();
            let suffix: String = (0..rng.next() % 4).map(|_| rng.pick(PIECES)).collect();
            let doc = format!("{prefix}{deep}{suffix}");
            let seen = max_nesting(doc.as_bytes(), usize::MAX - 1);
            if let Err(e) = serde_norway::from_str::<Value>(&doc)
                && e.to_string().contains("recursion limit exceeded")
            {
                assert!(seen >= 128, "round {round}: {doc:?} scanned as {seen} deep");
            }
            let plain: String = (0..rng.next() % 24).map(|_| rng.pick(PIECES)).collect();
            if let Ok(value) = serde_norway::from_str::<Value>(&plain) {
                let scanned = max_nesting(plain.as_bytes(), usize::MAX - 1);
                let depth = crate::patch::limits::depth(&value);
                assert!(
                    scanned <= depth,
                    "round {round}: {plain:?} scanned as {scanned} deep, decodes {depth} deep"
                );
            }
        }
    }
}
