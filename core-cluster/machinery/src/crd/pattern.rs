//! A schema's `pattern` as upstream compiles it: Go's `regexp` (RE2 syntax), which
//! kube-openapi's validator and apiextensions' schema check (`schema/validation.go`:
//! `must be a valid regular expression, but isn't: …`) both use.
//!
//! The `regex` crate speaks nearly the same syntax and is linear-time as RE2 is. Where the
//! two differ in meaning, a pattern is rewritten before it is compiled so that it matches what
//! Go's would: Go's `\d`, `\w`, `\s` and `\b` are ASCII-only (the `regex` crate's are Unicode),
//! and Go refuses a repeat count above 1,000 (`invalid repeat count`). A pattern that Go
//! would refuse, or whose compiled form is over [`SIZE_LIMIT`] (Go's `expression too large`),
//! is an error in Go's words, so a definition that upstream refuses is refused here too.

use regex_syntax::ast::{
    self, AssertionKind, Ast, ClassPerl, ClassPerlKind, ClassSetItem, ErrorKind, RepetitionKind,
    RepetitionRange, Visitor,
};

/// The most a compiled pattern may take (the `regex` crate's size limit; its default is
/// 10 MiB). A `pattern` is a few dozen bytes in practice; this refuses the ones built to make
/// compilation or matching expensive.
pub const SIZE_LIMIT: usize = 1 << 20;

/// Go's `syntax.maxRepeat`: the largest count of a `{n,m}` repetition.
const MAX_REPEAT: u32 = 1000;

/// Go's limit on how deeply a regexp nests (`syntax.maxHeight`).
const NEST_LIMIT: u32 = 1000;

/// Compiles `pattern` with Go's meaning, or gives Go's message for it
/// (``error parsing regexp: <code>: `<expr>` ``).
pub fn compile(pattern: &str) -> Result<regex::Regex, String> {
    let parsed = ast::parse::ParserBuilder::new()
        .nest_limit(NEST_LIMIT)
        .build()
        .parse(pattern)
        .map_err(|e| go_parse_error(pattern, &e))?;
    let rewrite = Rewrite {
        pattern,
        edits: Vec::new(),
    };
    let mut edits = ast::visit(&parsed, rewrite).map_err(|e| go_message(e.0, &e.1))?;
    let mut text = pattern.to_owned();
    // From the end, so earlier offsets stay valid.
    edits.sort_by_key(|(start, _, _)| std::cmp::Reverse(*start));
    for (start, end, with) in edits {
        text.replace_range(start..end, with);
    }
    regex::RegexBuilder::new(&text)
        .size_limit(SIZE_LIMIT)
        .dfa_size_limit(SIZE_LIMIT)
        .nest_limit(NEST_LIMIT)
        .build()
        .map_err(|e| match e {
            regex::Error::CompiledTooBig(_) => go_message("expression too large", pattern),
            other => format!("error parsing regexp: {other}"),
        })
}

fn go_message(code: &str, expr: &str) -> String {
    format!("error parsing regexp: {code}: `{expr}`")
}

/// Go's error code for what the parser found, and the part of the pattern Go names.
fn go_parse_error(pattern: &str, e: &ast::Error) -> String {
    let span = e.span();
    let at = |start: usize, end: usize| pattern.get(start..end).unwrap_or(pattern);
    let here = at(span.start.offset, span.end.offset);
    let (code, expr) = match e.kind() {
        ErrorKind::GroupUnclosed => ("missing closing )", pattern),
        ErrorKind::GroupUnopened => ("unexpected )", pattern),
        ErrorKind::ClassUnclosed => ("missing closing ]", at(span.start.offset, pattern.len())),
        ErrorKind::ClassRangeInvalid | ErrorKind::ClassRangeLiteral => {
            ("invalid character class range", here)
        }
        ErrorKind::ClassEscapeInvalid | ErrorKind::EscapeUnrecognized => {
            ("invalid escape sequence", here)
        }
        ErrorKind::EscapeUnexpectedEof => ("trailing backslash at end of expression", ""),
        ErrorKind::RepetitionMissing => ("missing argument to repetition operator", here),
        ErrorKind::RepetitionCountInvalid
        | ErrorKind::RepetitionCountUnclosed
        | ErrorKind::RepetitionCountDecimalEmpty
        | ErrorKind::DecimalInvalid
        | ErrorKind::DecimalEmpty => ("invalid repeat count", here),
        ErrorKind::NestLimitExceeded(_) => ("expression nests too deeply", pattern),
        ErrorKind::GroupNameDuplicate { .. }
        | ErrorKind::GroupNameEmpty
        | ErrorKind::GroupNameInvalid
        | ErrorKind::GroupNameUnexpectedEof => ("invalid named capture", here),
        ErrorKind::UnicodeClassInvalid => ("invalid character class range", here),
        ErrorKind::UnsupportedLookAround
        | ErrorKind::UnsupportedBackreference
        | ErrorKind::FlagUnrecognized
        | ErrorKind::FlagDanglingNegation
        | ErrorKind::FlagDuplicate { .. }
        | ErrorKind::FlagRepeatedNegation { .. }
        | ErrorKind::FlagUnexpectedEof => ("invalid or unsupported Perl syntax", here),
        _ => return format!("error parsing regexp: {}", e.kind()),
    };
    go_message(code, expr)
}

/// What a pattern needs changed to mean what Go's does, found by walking its syntax tree
/// (the walk keeps its own stack: a deeply nested pattern costs no call stack).
struct Rewrite<'p> {
    /// The pattern walked.
    pattern: &'p str,
    /// `(start, end, replacement)` byte ranges of the pattern.
    edits: Vec<(usize, usize, &'static str)>,
}

impl Rewrite<'_> {
    fn text(&self, span: &ast::Span) -> String {
        self.pattern
            .get(span.start.offset..span.end.offset)
            .unwrap_or(self.pattern)
            .to_owned()
    }
}

/// Go's ASCII classes (`regexp/syntax` `perlGroup`), outside and inside brackets.
fn ascii_class(class: &ClassPerl, in_brackets: bool) -> &'static str {
    match (&class.kind, class.negated, in_brackets) {
        (ClassPerlKind::Digit, false, false) => "[0-9]",
        (ClassPerlKind::Digit, false, true) => "0-9",
        (ClassPerlKind::Digit, true, _) => "[^0-9]",
        (ClassPerlKind::Word, false, false) => "[0-9A-Za-z_]",
        (ClassPerlKind::Word, false, true) => "0-9A-Za-z_",
        (ClassPerlKind::Word, true, _) => "[^0-9A-Za-z_]",
        (ClassPerlKind::Space, false, false) => r"[\t\n\f\r ]",
        (ClassPerlKind::Space, false, true) => r"\t\n\f\r ",
        (ClassPerlKind::Space, true, _) => r"[^\t\n\f\r ]",
    }
}

impl Visitor for Rewrite<'_> {
    type Output = Vec<(usize, usize, &'static str)>;
    /// Go's error code and the part of the pattern it names.
    type Err = (&'static str, String);

    fn finish(self) -> Result<Self::Output, Self::Err> {
        Ok(self.edits)
    }

    fn visit_pre(&mut self, node: &Ast) -> Result<(), Self::Err> {
        match node {
            Ast::ClassPerl(class) => {
                self.edits.push((
                    class.span.start.offset,
                    class.span.end.offset,
                    ascii_class(class, false),
                ));
            }
            Ast::Assertion(a) => {
                let with = match a.kind {
                    AssertionKind::WordBoundary => r"(?-u:\b)",
                    AssertionKind::NotWordBoundary => r"(?-u:\B)",
                    AssertionKind::StartLine
                    | AssertionKind::EndLine
                    | AssertionKind::StartText
                    | AssertionKind::EndText => return Ok(()),
                    // `\b{start}` and the like are not Go syntax.
                    _ => {
                        return Err(("invalid escape sequence", self.text(&a.span)));
                    }
                };
                self.edits
                    .push((a.span.start.offset, a.span.end.offset, with));
            }
            Ast::Repetition(rep) => {
                if let RepetitionKind::Range(range) = &rep.op.kind {
                    let (RepetitionRange::Exactly(n)
                    | RepetitionRange::AtLeast(n)
                    | RepetitionRange::Bounded(_, n)) = range;
                    let min = match range {
                        RepetitionRange::Bounded(m, _) => *m,
                        _ => *n,
                    };
                    if *n > MAX_REPEAT || min > MAX_REPEAT {
                        return Err(("invalid repeat count", self.text(&rep.op.span)));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn visit_class_set_item_pre(&mut self, item: &ClassSetItem) -> Result<(), Self::Err> {
        if let ClassSetItem::Perl(class) = item {
            self.edits.push((
                class.span.start.offset,
                class.span.end.offset,
                ascii_class(class, true),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `regexp.Compile` error messages, which apiextensions puts after "must be a
    /// valid regular expression, but isn't: ".
    #[test]
    fn invalid_patterns_get_gos_messages() {
        let err = |p: &str| compile(p).unwrap_err();
        assert_eq!(err("("), "error parsing regexp: missing closing ): `(`");
        assert_eq!(err("a)"), "error parsing regexp: unexpected ): `a)`");
        assert_eq!(
            err("[[:alpha:]"),
            "error parsing regexp: missing closing ]: `[[:alpha:]`"
        );
        assert!(err("a{2,1}").starts_with("error parsing regexp: invalid repeat count"));
        assert!(
            err("(?<=a)b").starts_with("error parsing regexp: invalid or unsupported Perl syntax")
        );
        assert_eq!(
            err("a{1001}"),
            "error parsing regexp: invalid repeat count: `{1001}`"
        );
    }

    /// A pattern whose compiled form is too large is refused (Go: `expression too large`)
    /// rather than compiled and then skipped.
    #[test]
    fn a_pattern_too_large_to_compile_is_refused() {
        assert_eq!(
            compile(r"\w{1000}{1000}").unwrap_err(),
            "error parsing regexp: expression too large: `\\w{1000}{1000}`"
        );
    }

    /// Go's `\d`, `\w`, `\s` and `\b` are ASCII (`regexp/syntax` perl groups), in and out
    /// of brackets.
    #[test]
    fn perl_classes_are_ascii_as_in_go() {
        let re = compile(r"^\w+$").unwrap();
        assert!(re.is_match("abc_09"));
        assert!(!re.is_match("é"));
        assert!(compile(r"^[\d.]+$").unwrap().is_match("1.2"));
        assert!(!compile(r"^\d$").unwrap().is_match("٣"));
        assert!(compile(r"^\W$").unwrap().is_match("é"));
        assert!(compile(r"^[^\s]+$").unwrap().is_match("a"));
        assert!(compile(r"\bfoo\b").unwrap().is_match("a foo b"));
        // Unicode classes keep their meaning.
        assert!(compile(r"^\p{L}+$").unwrap().is_match("é"));
        // The usual DNS pattern is unchanged in meaning.
        let dns =
            compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").unwrap();
        assert!(dns.is_match("a.b-c"));
        assert!(!dns.is_match("-a"));
    }
}
