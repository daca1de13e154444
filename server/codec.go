package server

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/clusterd/clusterd/service"
)

// requestCodec is gRPC's proto codec with one change: a request that does
// not decode (a string field that is not UTF-8, broken wire data) is not
// answered by gRPC itself with INTERNAL, which is what gRPC does with any
// decoding error before an interceptor runs. The codec leaves the message
// empty and keeps the error for the interceptor chain (take), which answers
// INVALID_ARGUMENT naming the field, after authentication.
type requestCodec struct {
	encoding.CodecV2
	mu     sync.Mutex
	failed map[any]error
}

func newRequestCodec() *requestCodec {
	return &requestCodec{CodecV2: encoding.GetCodecV2("proto"), failed: map[any]error{}}
}

// Unmarshal decodes like gRPC's codec, keeping a decoding error for take.
func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	field := invalidUTF8Field(m.ProtoReflect().Descriptor(), data.Materialize(), "")
	bad := &service.InvalidArgumentError{Violations: []service.FieldViolation{{Field: field, Description: "is not valid UTF-8"}}}
	if field == "" {
		bad.Violations[0] = service.FieldViolation{Field: "request", Description: fmt.Sprintf("cannot be decoded: %v", err)}
	}
	c.mu.Lock()
	c.failed[v] = bad
	c.mu.Unlock()
	return nil
}

// take returns (and forgets) the decoding error of request v, if any.
func (c *requestCodec) take(v any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err, ok := c.failed[v]
	if ok {
		delete(c.failed, v)
	}
	return err
}

// invalidUTF8Field walks wire data of a message of type md and returns the
// path of the first string field that is not UTF-8 ("cluster.display_name",
// "remove_nodes[1]"), or "" if none is.
func invalidUTF8Field(md protoreflect.MessageDescriptor, b []byte, prefix string) string {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || fd.IsMap() {
			continue
		}
		name := prefix + string(fd.Name())
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, seen[num])
			seen[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind:
			if p := invalidUTF8Field(fd.Message(), v, name+"."); p != "" {
				return p
			}
		}
	}
	return ""
}
