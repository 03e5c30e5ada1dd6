package dev.hoptrace.kafka;

/**
 * A trace context, text form or envelope that does not decode. {@link #error()} is the error
 * name of {@code docs/trace-format.md} ({@code truncated}, {@code unsupported_version}, ...).
 *
 * <p>Thrown on the hot path only for broken input; carries no stack trace.
 */
public final class DecodeException extends Exception {
    private static final long serialVersionUID = 1L;

    /** The error names of {@code docs/trace-format.md}. */
    public enum Error {
        /** Fewer bytes than the header or the stamps need. */
        TRUNCATED("truncated"),
        /** Byte 0 is not version 1. */
        UNSUPPORTED_VERSION("unsupported_version"),
        /** More than 16 stamps declared. */
        TOO_MANY_STAMPS("too_many_stamps"),
        /** Bits 5 or 6 of byte 1 set. */
        RESERVED_BITS("reserved_bits"),
        /** More bytes than the header declares. */
        TRAILING_BYTES("trailing_bytes"),
        /** A present trace id of 16 zero bytes. */
        INVALID_TRACE_ID("invalid_trace_id"),
        /** A text form without the {@code ht1.} prefix. */
        BAD_TEXT_PREFIX("bad_text_prefix"),
        /** A text form that is not canonical unpadded base64url. */
        BAD_BASE64("bad_base64"),
        /** A message that does not start with the envelope magic. */
        NOT_ENVELOPED("not_enveloped");

        private final String wireName;

        Error(String wireName) {
            this.wireName = wireName;
        }

        /** The name the document and the test vectors use. */
        public String wireName() {
            return wireName;
        }
    }

    private final Error error;

    /** A decode failure of kind {@code error}. */
    public DecodeException(Error error) {
        super(error.wireName(), null, false, false);
        this.error = error;
    }

    /** What is wrong. */
    public Error error() {
        return error;
    }
}
