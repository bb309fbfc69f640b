//! Bearer tokens of the `Authorization` header.

use axum::http::{HeaderMap, header};

/// The token of an `Authorization: Bearer <token>` header, as upstream's
/// `plugin/pkg/authenticator/request/bearertoken/bearertoken.go` `AuthenticateRequest` reads
/// it: the header's first value, trimmed; the scheme is case-insensitive and followed by one
/// space; the token runs to the next space. `None` when there is no such header, the scheme
/// is another, or the token is empty (`Bearer `, or two spaces before the token): the request
/// then carries no token at all.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    // Go's strings.TrimSpace; a header value holds no other whitespace than these.
    let auth = value.trim_matches(|c: char| c.is_ascii_whitespace());
    // strings.SplitN(auth, " ", 3): parts[0] the scheme, parts[1] the token.
    let mut parts = auth.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn token_of(value: &'static str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
        bearer_token(&headers).map(str::to_owned)
    }

    /// bearertoken.go `AuthenticateRequest`: `TrimSpace`, `SplitN(auth, " ", 3)`, the scheme
    /// lower-cased to `bearer`, `parts[1]` the token, an empty one no token.
    #[test]
    fn bearer_tokens_are_parsed_as_bearertoken_go() {
        assert_eq!(bearer_token(&HeaderMap::new()), None);
        assert_eq!(token_of("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(token_of("bEaReR abc").as_deref(), Some("abc"));
        assert_eq!(token_of("  Bearer abc  ").as_deref(), Some("abc"));
        // The token ends at the next space.
        assert_eq!(token_of("Bearer abc def").as_deref(), Some("abc"));
        // An empty token, with or without the space before it: no token.
        assert_eq!(token_of("Bearer "), None);
        assert_eq!(token_of("Bearer"), None);
        assert_eq!(token_of("bearer  abc "), None);
        assert_eq!(token_of("Basic abc"), None);
        assert_eq!(token_of(""), None);
    }

    #[test]
    fn only_the_first_authorization_header_counts() {
        let mut headers = HeaderMap::new();
        headers.append(header::AUTHORIZATION, HeaderValue::from_static("Basic x"));
        headers.append(header::AUTHORIZATION, HeaderValue::from_static("Bearer y"));
        assert_eq!(bearer_token(&headers), None);
    }
}
