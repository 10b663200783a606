package rpc

import "google.golang.org/grpc"

// HandOverRequest is the call option by which a caller gives its request up to a handler
// in the same process (pkg/app's in-process channel), which then reads the caller's
// messages instead of a copy of them, when its service takes requests over
// (app.RequestTakeOver). The caller promises that the request was built for this call:
// once it is sent, the caller neither reads nor writes its QualityContext, and it writes
// nothing else the request holds (messages, slices, maps it may share with the caller's
// own state, which both sides then only read) for as long as the handler may keep it.
// Over the network the request is encoded either way and the option does nothing.
func HandOverRequest() grpc.CallOption { return handOverRequest{} }

type handOverRequest struct{ grpc.EmptyCallOption }

// HandsOverRequest reports whether opts hold HandOverRequest.
func HandsOverRequest(opts []grpc.CallOption) bool {
	for _, o := range opts {
		if _, ok := o.(handOverRequest); ok {
			return true
		}
	}
	return false
}
