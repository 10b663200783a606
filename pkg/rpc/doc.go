// Package rpc holds the gRPC plumbing every mantle service shares: the server and client
// interceptor chains, tenant authentication, and the helpers that turn domain errors into
// statuses with typed details (ErrorInfo, BadRequest, RetryInfo, QuotaFailure).
package rpc
