//! Headwater's errors as a stock gRPC client sees them.
//!
//! A failed call ends with a gRPC status whose details (the standard
//! `grpc-status-details-bin` trailer, a `google.rpc.Status`) carry one
//! `google.rpc.ErrorInfo`: domain "headwater.v1", reason = the ErrorCode name, metadata
//! {"code": number, "retriable": "true"|"false"}. `tonic-types` decodes it. A status
//! without that detail did not come from Headwater's error mapping: a transport failure
//! (connection refused, a message over the client's receive limit, a deadline) that
//! tonic or the network produced.
//!
//! Per-item answers (ProduceStream's responses, CreateTopics' results) carry
//! `error_code` numbers instead; `code_name` names them.

use std::fmt;

use serde_json::{Value, json};
use tonic_types::StatusExt;

use crate::proto;

pub const ERROR_DOMAIN: &str = "headwater.v1";

/// The ErrorInfo detail of a Headwater error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadwaterInfo {
    /// The ErrorCode name, e.g. "PARTITION_OUT_OF_RANGE" (names this build's proto does
    /// not know yet come through as sent).
    pub reason: String,
    pub code: Option<i32>,
    pub retriable: Option<bool>,
}

/// A failed call: its gRPC status and, when Headwater sent one, its ErrorInfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub grpc_code: tonic::Code,
    /// The status message; for a status tonic made itself, with its causes appended.
    pub message: String,
    pub info: Option<HeadwaterInfo>,
    /// Made by tonic from a local error (a broken connection, an oversized message), not
    /// received from the other side.
    pub local: bool,
}

impl ApiError {
    pub fn from_status(status: &tonic::Status) -> ApiError {
        let info = status
            .get_details_error_info()
            .filter(|info| info.domain == ERROR_DOMAIN)
            .map(|info| HeadwaterInfo {
                code: info.metadata.get("code").and_then(|c| c.parse().ok()),
                retriable: info.metadata.get("retriable").map(|r| r == "true"),
                reason: info.reason,
            });
        let mut message = status.message().to_owned();
        let mut cause = std::error::Error::source(status);
        let local = cause.is_some();
        while let Some(error) = cause {
            let text = error.to_string();
            if !message.contains(&text) {
                message = format!("{message}: {text}");
            }
            cause = error.source();
        }
        ApiError {
            grpc_code: status.code(),
            message,
            info,
            local,
        }
    }

    /// The ErrorCode name, when Headwater sent one.
    pub fn reason(&self) -> Option<&str> {
        self.info.as_ref().map(|i| i.reason.as_str())
    }

    /// No ErrorInfo: the status came from the transport (or a proxy), not the broker.
    pub fn is_transport(&self) -> bool {
        self.info.is_none()
    }

    /// Whether the same call may succeed later: the broker's `retriable` flag; for
    /// transport failures, a connection that could not be made or broke (tonic reports
    /// a connection reset in the middle of a call as UNKNOWN "transport error", and its
    /// own cancellation as CANCELLED). Only calls that are safe to repeat are retried on
    /// this (reads, CreateTopics, idempotent batches).
    pub fn is_retriable(&self) -> bool {
        match (&self.info, self.grpc_code) {
            (Some(info), _) => info.retriable.unwrap_or(false),
            (None, tonic::Code::Unavailable) => true,
            (None, tonic::Code::Unknown | tonic::Code::Cancelled) => self.local,
            (None, _) => false,
        }
    }

    pub fn to_json(&self) -> Value {
        let info = self.info.as_ref();
        json!({
            "grpc_code": format!("{:?}", self.grpc_code),
            "grpc_code_number": self.grpc_code as i32,
            "message": self.message,
            "transport_error": self.is_transport(),
            "local": self.local,
            "reason": info.map(|i| i.reason.clone()),
            "code": info.and_then(|i| i.code),
            "retriable": info.and_then(|i| i.retriable),
        })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.info {
            Some(info) => write!(
                f,
                "{} (gRPC {:?}, retriable {}): {}",
                info.reason,
                self.grpc_code,
                info.retriable
                    .map_or("unknown".to_owned(), |r| r.to_string()),
                self.message
            ),
            None => write!(
                f,
                "transport error (gRPC {:?}): {}",
                self.grpc_code, self.message
            ),
        }
    }
}

/// The name of an `error_code` number ("NONE", "TOPIC_ALREADY_EXISTS", ...), or the
/// number itself for a code newer than this build's proto.
pub fn code_name(code: i32) -> String {
    proto::ErrorCode::try_from(code)
        .map_or_else(|_| code.to_string(), |c| c.as_str_name().to_owned())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tonic_types::{ErrorDetails, StatusExt};

    use super::*;

    fn headwater_status(reason: &str, code: &str, retriable: &str) -> tonic::Status {
        let metadata = HashMap::from([
            ("code".to_owned(), code.to_owned()),
            ("retriable".to_owned(), retriable.to_owned()),
        ]);
        let details = ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata);
        tonic::Status::with_error_details(tonic::Code::InvalidArgument, "the message", details)
    }

    #[test]
    fn reads_the_error_info_of_a_headwater_status() {
        let error =
            ApiError::from_status(&headwater_status("PARTITION_OUT_OF_RANGE", "1004", "false"));
        let info = HeadwaterInfo {
            reason: "PARTITION_OUT_OF_RANGE".to_owned(),
            code: Some(1004),
            retriable: Some(false),
        };
        assert_eq!(error.info, Some(info));
        assert!(!error.is_transport() && !error.is_retriable() && !error.local);
        let retriable =
            ApiError::from_status(&headwater_status("NOT_LEADER_OR_FOLLOWER", "6", "true"));
        assert!(retriable.is_retriable());
    }

    #[test]
    fn a_status_without_error_info_is_a_transport_error() {
        let refused = ApiError::from_status(&tonic::Status::unavailable("connection refused"));
        assert!(refused.is_transport() && refused.is_retriable());
        let too_large = ApiError::from_status(&tonic::Status::out_of_range("message too large"));
        assert!(too_large.is_transport() && !too_large.is_retriable());
        // UNKNOWN from the other side (no local cause) is not a broken connection.
        assert!(!ApiError::from_status(&tonic::Status::unknown("boom")).is_retriable());
    }

    #[test]
    fn names_error_codes() {
        assert_eq!(code_name(36), "TOPIC_ALREADY_EXISTS");
        assert_eq!(code_name(0), "NONE");
        assert_eq!(code_name(424_242), "424242");
    }
}
