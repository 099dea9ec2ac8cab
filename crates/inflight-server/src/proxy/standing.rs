//! Where a proxied request queues while it waits for a slot (`--max-wait`): its priority level and its
//! flow, formed for each request from the `--priority` and `--flow` templates as keys are (`templates`).
//!
//! Both are formed and checked on every proxied request, whether it waits or not, so that a bad value is
//! refused the same way whatever the key's load: 400 `invalid_priority` or `invalid_flow`, before
//! anything is charged or acquired. Where a template's placeholder has nothing in the request (a header
//! absent or empty, no bearer token), the default applies: level 0, the default flow.

use http::StatusCode;
use inflight::{AcquireOptions, MAX_FLOW_LEN};

use super::sources::Source;
use super::templates::{parse, parse_text, Template, Unformed};
use crate::error::ApiError;

/// The `--priority` and `--flow` templates of a proxy, parsed (either may be unset).
#[derive(Clone, Debug, Default)]
pub struct StandingTemplates {
    priority: Option<Template>,
    flow: Option<Template>,
    /// The levels a request may ask for (`--priorities`; empty: any).
    levels: Vec<u8>,
}

/// Where one request queues (by default: level 0, the default flow).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Place {
    pub(super) priority: u8,
    /// None: the default flow.
    pub(super) flow: Option<String>,
}

impl StandingTemplates {
    /// With only `levels` (`--priorities`) allowed, unless it is empty; set before the templates.
    pub fn levels(self, levels: &[u8]) -> Self {
        Self {
            levels: levels.to_vec(),
            ..self
        }
    }

    /// With the `--priority` template `text`; Err says why it is unusable.
    pub fn priority(self, text: &str) -> Result<Self, String> {
        let template = parse(text).map_err(|why| format!("{text:?}: {why}"))?;
        if let Some(fixed) = template.fixed() {
            self.level(fixed)
                .map_err(|why| format!("{text:?}: {why}"))?;
        }
        Ok(Self {
            priority: Some(template),
            ..self
        })
    }

    /// With the `--flow` template `text`; Err says why it is unusable.
    pub fn flow(self, text: &str) -> Result<Self, String> {
        let flow = ("--flow", "a flow", MAX_FLOW_LEN);
        Ok(Self {
            flow: Some(parse_text(text, flow, "for the default flow")?),
            ..self
        })
    }

    /// True when a template has `{path}`.
    pub(super) fn uses_path(&self) -> bool {
        let templates = [&self.priority, &self.flow];
        templates.into_iter().flatten().any(Template::uses_path)
    }

    /// `options` with the priority and the flow of the request `source`.
    #[inline]
    pub(super) fn options(
        &self,
        source: &Source<'_>,
        options: AcquireOptions,
    ) -> Result<AcquireOptions, ApiError> {
        if self.priority.is_none() && self.flow.is_none() {
            return Ok(options);
        }
        self.placed(source, options)
    }

    /// [`StandingTemplates::options`] with a template set: out of line, so that a proxy without
    /// `--priority` and `--flow` carries none of it.
    #[inline(never)]
    fn placed(
        &self,
        source: &Source<'_>,
        options: AcquireOptions,
    ) -> Result<AcquireOptions, ApiError> {
        let place = self.place(source)?;
        let options = options.priority(place.priority);
        Ok(match place.flow {
            Some(flow) => options.flow(flow),
            None => options,
        })
    }

    /// Where the request `source` queues.
    pub(super) fn place(&self, source: &Source<'_>) -> Result<Place, ApiError> {
        let mut bearer = None;
        let priority = match render(&self.priority, source, &mut bearer) {
            Ok(Some(text)) => self.level(&text),
            Ok(None) => Ok(0),
            Err(why) => Err(why),
        }
        .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, "invalid_priority", why))?;
        let flow = match render(&self.flow, source, &mut bearer) {
            Ok(Some(flow)) if flow.len() > MAX_FLOW_LEN => Err(format!(
                "The flow is {} bytes: at most {MAX_FLOW_LEN}.",
                flow.len()
            )),
            formed => formed,
        }
        .map_err(|why| ApiError::new(StatusCode::BAD_REQUEST, "invalid_flow", why))?;
        Ok(Place { priority, flow })
    }

    /// The level `text` names ([`level`]), if it is one of the levels allowed.
    fn level(&self, text: &str) -> Result<u8, String> {
        let level = level(text)?;
        if !self.levels.is_empty() && !self.levels.contains(&level) {
            return Err(format!(
                "The priority {level} is not one of the configured levels {:?}.",
                self.levels
            ));
        }
        Ok(level)
    }
}

/// The value of `template` for a request; None when unset or when what it needs is missing.
fn render(
    template: &Option<Template>,
    source: &Source<'_>,
    bearer: &mut Option<[u8; 16]>,
) -> Result<Option<String>, String> {
    let Some(template) = template else {
        return Ok(None);
    };
    match template.render(source, bearer) {
        Ok(value) => Ok(Some(value)),
        Err(Unformed::Missing(_)) => Ok(None),
        Err(Unformed::Invalid(why)) => Err(why),
    }
}

/// The priority level `text` names: a decimal whole number from 0 to 255 (digits only, no sign). The one
/// check of a level, at start-up (a fixed `--priority`) and for each request.
pub(super) fn level(text: &str) -> Result<u8, String> {
    let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    match text.parse::<u8>() {
        Ok(level) if digits => Ok(level),
        _ => Err(format!(
            "The priority {:?} is not a whole number from 0 to 255.",
            text.chars().take(32).collect::<String>()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::sources::tests::{headers, source};

    fn queue(priority: &str, flow: &str) -> StandingTemplates {
        StandingTemplates::default()
            .priority(priority)
            .unwrap()
            .flow(flow)
            .unwrap()
    }

    #[test]
    fn a_level_is_a_whole_number_from_0_to_255() {
        for (text, want) in [("0", 0), ("7", 7), ("255", 255), ("007", 7)] {
            assert_eq!(level(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "256",
            "-1",
            "+1",
            "abc",
            " 1",
            "1.0",
            "1e2",
            "99999999999999999999",
        ] {
            assert!(level(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_the_configured_levels_are_taken() {
        let queue = StandingTemplates::default()
            .levels(&[0, 5, 9])
            .priority("{header:X-Priority}")
            .unwrap();
        let place = |level: &str| queue.place(&source(&headers(&[("x-priority", level)]), "/"));
        assert_eq!(place("9").unwrap().priority, 9);
        assert_eq!(place("6").unwrap_err().code(), "invalid_priority");
        let fixed = StandingTemplates::default().levels(&[0, 5]).priority("7");
        assert!(
            fixed.is_err(),
            "a fixed level outside them is refused at start-up"
        );
    }

    #[test]
    fn each_request_has_its_place_or_the_defaults() {
        let queue = queue(
            "{header:X-Priority}",
            "tenant:{header:X-Tenant}/{bearer_hash}",
        );
        let place = queue.place(&source(
            &headers(&[
                ("x-priority", "9"),
                ("x-tenant", "acme"),
                ("authorization", "Bearer abc"),
            ]),
            "/",
        ));
        let flow = Some("tenant:acme/ba7816bf8f01cfea".to_owned());
        assert_eq!(place.unwrap(), Place { priority: 9, flow });
        // A placeholder with nothing in the request: the default, for each alone.
        let place = queue
            .place(&source(&headers(&[("x-tenant", "acme")]), "/"))
            .unwrap();
        assert_eq!(place, Place::default());
        let place = queue
            .place(&source(&headers(&[("x-priority", "")]), "/"))
            .unwrap();
        assert_eq!(place, Place::default());
        // Unset templates: the defaults, nothing rendered.
        let unset = StandingTemplates::default();
        let place = unset
            .place(&source(&headers(&[("x-priority", "abc")]), "/"))
            .unwrap();
        assert_eq!(place, Place::default());
    }

    #[test]
    fn a_bad_level_or_flow_is_refused() {
        let queue = queue("{header:X-Priority}", "{header:X-Tenant}");
        let code = |pairs: &[(&str, &str)]| match queue.place(&source(&headers(pairs), "/")) {
            Ok(place) => panic!("{pairs:?}: {place:?}"),
            Err(error) => {
                assert_eq!(error.status(), StatusCode::BAD_REQUEST);
                error.code()
            }
        };
        for bad in ["abc", "256", "-1"] {
            assert_eq!(code(&[("x-priority", bad)]), "invalid_priority", "{bad}");
        }
        let twice = [("x-priority", "1"), ("x-priority", "2")];
        assert_eq!(code(&twice), "invalid_priority");
        let long = "t".repeat(MAX_FLOW_LEN + 1);
        assert_eq!(code(&[("x-tenant", &long)]), "invalid_flow");
        let longest = "t".repeat(MAX_FLOW_LEN);
        let place = queue
            .place(&source(&headers(&[("x-tenant", &longest)]), "/"))
            .unwrap();
        assert_eq!(place.flow, Some(longest));
    }

    #[test]
    fn bad_templates_are_refused_at_start_up() {
        let none = StandingTemplates::default;
        for (bad, why) in [
            ("300", "0 to 255"),
            ("", "0 to 255"),
            ("{header:X", "without its `}`"),
            ("{header:Authorization}", "secret"),
        ] {
            let err = none().priority(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert!(none().priority("5").is_ok(), "a fixed level");
        assert!(none().flow("").unwrap_err().contains("empty"));
        let long = format!("{}{{header:X-Tenant}}", "t".repeat(MAX_FLOW_LEN + 1));
        assert!(none().flow(&long).unwrap_err().contains("at most"));
        assert!(none()
            .flow("{header:cookie}")
            .unwrap_err()
            .contains("secret"));
    }
}
