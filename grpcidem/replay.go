package grpcidem

// replayed is a stored response on its way back to a client: a message
// whose marshalled form is the stored bytes, so the default proto codec
// sends them as they were recorded, whatever the response type (the
// interceptor does not know it on a replay). It is a protobuf-v1-style
// message with a Marshal method, which the codec uses as it is.
type replayed struct{ b []byte }

func (r *replayed) Reset()                   {}
func (r *replayed) String() string           { return "grpcidem: replayed response" }
func (r *replayed) ProtoMessage()            {}
func (r *replayed) Marshal() ([]byte, error) { return r.b, nil }

// Size lets proto.Size avoid a marshal.
func (r *replayed) Size() int { return len(r.b) }
