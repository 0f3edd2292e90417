//! The bearer token check of the admin API's mutating calls (`cluster.admin_token`).

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::warn;

/// Checks `Authorization: Bearer <token>` against `cluster.admin_token` (in constant time);
/// logs refusals and returns the 401 answer to send.
pub(super) fn authorise(
    admin_token: Option<&str>,
    headers: &HeaderMap,
    action: &str,
) -> Result<(), Box<Response>> {
    use subtle::ConstantTimeEq;
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(expected) = admin_token else {
        warn!(
            action,
            "admin call refused: no cluster.admin_token is configured"
        );
        return Err(Box::new(
            (
                StatusCode::UNAUTHORIZED,
                "mutating admin calls are disabled: set cluster.admin_token\n",
            )
                .into_response(),
        ));
    };
    let accepted =
        presented.is_some_and(|token| bool::from(expected.as_bytes().ct_eq(token.as_bytes())));
    if accepted {
        Ok(())
    } else {
        warn!(
            action,
            presented = presented.is_some(),
            "admin call refused: wrong or missing token"
        );
        Err(Box::new(
            (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response(),
        ))
    }
}
