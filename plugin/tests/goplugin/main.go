// A HashiCorp go-plugin plugin for an interop check of charly's host
// (plugin/tests/go_interop.rs): AutoMTLS (Go's P-521 certificates, Go's TLS
// verifying charly's), health, controller, broker. Written against Debian 12's
// packages (go-plugin 1.0.1, golang/protobuf 1.3 API); see README.md. PluginMeta.Describe and
// Provider.Invoke are served with well-known messages that are wire-compatible
// with charly's (Capabilities.calver = field 1 string, InvokeReply.result_json =
// field 1 bytes); Invoke reads executor_broker_id (field 6) from the unknown
// fields, dials the host's ExecutorService over the broker and calls Venue.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	plugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	emptypb "github.com/golang/protobuf/ptypes/empty"
	wrapperspb "github.com/golang/protobuf/ptypes/wrappers"
	"google.golang.org/protobuf/encoding/protowire"
)

type gp struct{ plugin.NetRPCUnsupportedPlugin }

var broker *plugin.GRPCBroker

func describe(srv interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(emptypb.Empty)
	if err := dec(in); err != nil {
		return nil, err
	}
	return &wrapperspb.StringValue{Value: "go-plugin-interop"}, nil
}

func invoke(srv interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(emptypb.Empty)
	if err := dec(in); err != nil {
		return nil, err
	}
	var id uint64
	b := in.XXX_unrecognized
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		if num == 6 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			id = v
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		b = b[m:]
	}
	out := map[string]string{}
	if id != 0 {
		conn, err := broker.Dial(uint32(id))
		if err != nil {
			return nil, fmt.Errorf("broker dial %d: %w", id, err)
		}
		defer conn.Close()
		venue := new(wrapperspb.StringValue)
		if err := conn.Invoke(ctx, "/charlyplugin.ExecutorService/Venue", &emptypb.Empty{}, venue); err != nil {
			return nil, fmt.Errorf("venue: %w", err)
		}
		out["venue"] = venue.Value
	}
	out["tls"] = fmt.Sprint(os.Getenv("PLUGIN_CLIENT_CERT") != "")
	j, _ := json.Marshal(out)
	return &wrapperspb.BytesValue{Value: j}, nil
}

func (gp) GRPCServer(b *plugin.GRPCBroker, s *grpc.Server) error {
	broker = b
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "charlyplugin.PluginMeta",
		HandlerType: (*interface{})(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Describe", Handler: describe}},
	}, struct{}{})
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "charlyplugin.Provider",
		HandlerType: (*interface{})(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "Invoke", Handler: invoke}},
	}, struct{}{})
	return nil
}

func (gp) GRPCClient(context.Context, *plugin.GRPCBroker, *grpc.ClientConn) (interface{}, error) {
	return nil, nil
}

func main() {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: plugin.HandshakeConfig{ProtocolVersion: 1, MagicCookieKey: "CHARLY_PLUGIN", MagicCookieValue: "charly-plugin-v1"},
		Plugins:         plugin.PluginSet{"charly": gp{}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}
