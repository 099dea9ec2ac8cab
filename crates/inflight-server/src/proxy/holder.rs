//! Who holds a proxied request's slot, as `GET /v1/keys/{key}/permits` lists it: a label formed from the
//! `--holder` template as keys are (`templates`), such as `{client_ip}` or `{header:X-User}`; and what
//! becomes of a response whose permit is revoked (`--on-revoke`).
//!
//! The label is formed only for a limited request, once its keys are, and checked as the library checks
//! it: 1 to 128 bytes without control characters, else 400 `invalid_holder`. Where the template's
//! placeholder has nothing in the request (a header absent or empty), the permit has no label. Labels
//! follow the keys' rule on secrets: a template cannot name the `Authorization`, `Proxy-Authorization`
//! or `Cookie` header, and a bearer token is only ever its `{bearer_hash}`, the same 16 hex digits the
//! access log shows.

use http::StatusCode;
use inflight::store::MAX_HOLDER_LEN;
use inflight::AcquireOptions;

use super::sources::Source;
use super::templates::{parse_text, Template, Unformed};
use crate::error::ApiError;

/// The `--holder` template of a proxy, parsed, if set.
#[derive(Clone, Debug, Default)]
pub struct HolderTemplate(Option<Template>);

/// What becomes of a response whose permit is lost while it runs (`--on-revoke`): revoked by an admin,
/// or its lease gone at renewal with the key full without it. Either way its slot is free already.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnRevoke {
    /// Its body is cut short at once (the client sees the response break off, the upstream's connection
    /// is dropped); a request still waiting for the upstream's headers is answered 409 `revoked`.
    #[default]
    End,
    /// It runs to its end, no longer counted.
    Finish,
}

impl HolderTemplate {
    /// The `--holder` template `text`; Err says why it is unusable.
    pub fn parse(text: &str) -> Result<Self, String> {
        let holder = ("--holder", "a holder", MAX_HOLDER_LEN);
        Ok(Self(Some(parse_text(text, holder, "for no label")?)))
    }

    /// True when the template has `{path}` or `{path_hash}`.
    pub(super) fn uses_path(&self) -> bool {
        self.0.as_ref().is_some_and(Template::uses_path)
    }

    /// `options` with the label of the request `source`, when `--holder` is set and forms one.
    #[inline]
    pub(super) fn options(
        &self,
        source: &Source<'_>,
        options: AcquireOptions,
    ) -> Result<AcquireOptions, ApiError> {
        match &self.0 {
            None => Ok(options),
            Some(template) => labelled(template, source, options),
        }
    }
}

/// [`HolderTemplate::options`] with a template: out of line, so that a proxy without `--holder` carries
/// none of it.
#[inline(never)]
fn labelled(
    template: &Template,
    source: &Source<'_>,
    options: AcquireOptions,
) -> Result<AcquireOptions, ApiError> {
    match label(template, source) {
        Ok(Some(label)) => Ok(options.holder(label)),
        Ok(None) => Ok(options),
        Err(why) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_holder",
            why,
        )),
    }
}

/// The label of the request `source`: None when the template's placeholder has nothing in it.
fn label(template: &Template, source: &Source<'_>) -> Result<Option<String>, String> {
    let label = match template.render(source, &mut None) {
        Ok(label) => label,
        Err(Unformed::Missing(_)) => return Ok(None),
        Err(Unformed::Invalid(why)) => return Err(why),
    };
    if label.len() > MAX_HOLDER_LEN {
        return Err(format!(
            "The holder is {} bytes: at most {MAX_HOLDER_LEN}.",
            label.len()
        ));
    }
    if label.chars().any(char::is_control) {
        return Err("The holder may not contain control characters.".to_owned());
    }
    Ok(Some(label))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::sources::tests::{headers, source};

    fn label_of(text: &str, pairs: &[(&str, &str)]) -> Result<Option<String>, String> {
        let HolderTemplate(Some(template)) = HolderTemplate::parse(text).unwrap() else {
            unreachable!("parsed")
        };
        label(&template, &source(&headers(pairs), "/v1/chat-messages"))
    }

    #[test]
    fn a_label_is_formed_as_a_key_is() {
        assert_eq!(label_of("{client_ip}", &[]).unwrap().unwrap(), "192.0.2.10");
        let user = label_of("user {header:X-User} at {client_ip}", &[("x-user", "ann")]);
        assert_eq!(user.unwrap().unwrap(), "user ann at 192.0.2.10");
        assert_eq!(
            label_of("{path}", &[]).unwrap().unwrap(),
            "/v1/chat-messages"
        );
        // SHA-256("abc"): the token itself is never a label.
        let bearer = label_of("{bearer_hash}", &[("authorization", "Bearer abc")]);
        assert_eq!(bearer.unwrap().unwrap(), "ba7816bf8f01cfea");
        assert_eq!(label_of("worker-1", &[]).unwrap().unwrap(), "worker-1");
    }

    #[test]
    fn nothing_in_the_request_is_no_label() {
        assert_eq!(label_of("{header:X-User}", &[]), Ok(None));
        assert_eq!(label_of("u:{header:X-User}", &[("x-user", "")]), Ok(None));
        assert_eq!(label_of("{bearer_hash}", &[]), Ok(None));
    }

    #[test]
    fn a_bad_label_is_refused() {
        let longest = "u".repeat(MAX_HOLDER_LEN);
        let fits = label_of("{header:X-User}", &[("x-user", &longest)]);
        assert_eq!(fits.unwrap().unwrap(), longest);
        let long = "u".repeat(MAX_HOLDER_LEN + 1);
        assert!(label_of("{header:X-User}", &[("x-user", &long)]).is_err());
        assert!(label_of("{header:X-User}", &[("x-user", "a\tb")]).is_err());
        let twice = [("x-user", "a"), ("x-user", "b")];
        assert!(label_of("{header:X-User}", &twice).is_err());
        let template = HolderTemplate::parse("{header:X-User}").unwrap();
        let pairs = headers(&[("x-user", &long)]);
        let error = template
            .options(&source(&pairs, "/"), AcquireOptions::new())
            .unwrap_err();
        assert_eq!(
            (error.status(), error.code()),
            (StatusCode::BAD_REQUEST, "invalid_holder")
        );
    }

    #[test]
    fn bad_templates_are_refused_at_start_up() {
        for (bad, why) in [
            ("", "empty"),
            ("{header:Authorization}", "secret"),
            ("{header:Cookie}", "secret"),
            ("{header:X", "without its `}`"),
            ("{client}", "unknown placeholder"),
        ] {
            let err = HolderTemplate::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let long = format!("{}{{client_ip}}", "t".repeat(MAX_HOLDER_LEN + 1));
        assert!(HolderTemplate::parse(&long)
            .unwrap_err()
            .contains("at most"));
    }
}
