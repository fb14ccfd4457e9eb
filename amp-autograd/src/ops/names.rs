//! Every op's name, declared once: the name the documented op lists (and PyTorch's
//! autocast) use for it, and whether it is [opaque](OpName::opaque). An op enters the
//! dispatch point with the `static` declared here; [`all`] lists them for the tests that
//! hold the names against the policy lists and the conformance vectors. Unary and binary
//! elementwise ops take the name of their kernel ([`UnaryOp::name`], [`BinaryOp::name`]),
//! so such a name is written once in the workspace, in `amp-kernels`.

use amp_kernels::{BinaryOp, UnaryOp};

use crate::dispatch::OpName;

/// One `static` [`OpName`] per entry (`new`: transparent, `opaque`: opaque), and the
/// list of them all.
macro_rules! op_names {
    ($($id:ident = $kind:ident($name:expr);)*) => {
        $(pub(crate) static $id: OpName = OpName::$kind($name);)*
        static SINGLE: &[&OpName] = &[$(&$id),*];
    };
}

/// One `static` array of [`OpName`]s per family of ops told apart by their spatial
/// dimensions (`max_pool1d`, `max_pool2d`, ...), and the list of them all.
macro_rules! op_families {
    ($($id:ident = [$($kind:ident($name:literal)),*];)*) => {
        $(pub(crate) static $id: [OpName; [$($name),*].len()] = [$(OpName::$kind($name)),*];)*
        static FAMILIES: &[&[OpName]] = &[$(&$id),*];
    };
}

op_names! {
    // pointwise: unary ops, named by their kernel (amp-kernels' one list of unary ops)
    NEG = new(UnaryOp::Neg.name());
    ABS = new(UnaryOp::Abs.name());
    EXP = new(UnaryOp::Exp.name());
    EXPM1 = new(UnaryOp::Expm1.name());
    LOG = new(UnaryOp::Log.name());
    LOG1P = new(UnaryOp::Log1p.name());
    LOG2 = new(UnaryOp::Log2.name());
    LOG10 = new(UnaryOp::Log10.name());
    SQRT = new(UnaryOp::Sqrt.name());
    RSQRT = new(UnaryOp::Rsqrt.name());
    RECIPROCAL = new(UnaryOp::Reciprocal.name());
    SIN = new(UnaryOp::Sin.name());
    COS = new(UnaryOp::Cos.name());
    TAN = new(UnaryOp::Tan.name());
    ASIN = new(UnaryOp::Asin.name());
    ACOS = new(UnaryOp::Acos.name());
    ATAN = new(UnaryOp::Atan.name());
    SINH = new(UnaryOp::Sinh.name());
    COSH = new(UnaryOp::Cosh.name());
    TANH = new(UnaryOp::Tanh.name());
    SIGMOID = new(UnaryOp::Sigmoid.name());
    RELU = new(UnaryOp::Relu.name());
    GELU = new(UnaryOp::Gelu.name());
    ERF = new(UnaryOp::Erf.name());
    ERFINV = new(UnaryOp::Erfinv.name());
    SQUARE = new(UnaryOp::Square.name());
    SIGN = new(UnaryOp::Sign.name());
    FLOOR = new(UnaryOp::Floor.name());
    CEIL = new(UnaryOp::Ceil.name());
    ROUND = new(UnaryOp::Round.name());
    // pointwise: binary ops, named by their kernel
    ADD = new(BinaryOp::Add.name());
    SUB = new(BinaryOp::Sub.name());
    MUL = new(BinaryOp::Mul.name());
    DIV = new(BinaryOp::Div.name());
    POW = new(BinaryOp::Pow.name());
    ATAN2 = new(BinaryOp::Atan2.name());
    MAXIMUM = new(BinaryOp::Maximum.name());
    MINIMUM = new(BinaryOp::Minimum.name());
    // pointwise: the other elementwise ops
    RSUB = new("rsub");
    DUNDER_RDIV = new("__rdiv__");
    DUNDER_RTRUEDIV = new("__rtruediv__");
    DUNDER_POW = new("__pow__");
    DUNDER_RPOW = new("__rpow__");
    // matmul
    MM = new("mm");
    BMM = new("bmm");
    MATMUL = new("matmul");
    DUNDER_MATMUL = new("__matmul__");
    MV = new("mv");
    DOT = new("dot");
    OUTER = new("outer");
    ADDMM = new("addmm");
    ADDBMM = new("addbmm");
    BADDBMM = new("baddbmm");
    ADDMV = new("addmv");
    ADDR = new("addr");
    LINEAR = new("linear");
    CHAIN_MATMUL = new("chain_matmul");
    MULTI_DOT = new("multi_dot");
    // conv
    CONV1D = new("conv1d");
    CONV2D = new("conv2d");
    CONV3D = new("conv3d");
    CONV_TRANSPOSE1D = new("conv_transpose1d");
    CONV_TRANSPOSE2D = new("conv_transpose2d");
    CONV_TRANSPOSE3D = new("conv_transpose3d");
    CONVOLUTION = new("_convolution");
    // reduce
    SUM = new("sum");
    MEAN = new("mean");
    PROD = new("prod");
    AMAX = new("amax");
    AMIN = new("amin");
    MAX = new("max");
    MIN = new("min");
    NORM = new("norm");
    LOGSUMEXP = new("logsumexp");
    VAR = new("var");
    STD = new("std");
    CUMSUM = new("cumsum");
    CUMPROD = new("cumprod");
    // shape
    RESHAPE = new("reshape");
    VIEW = new("view");
    TRANSPOSE = new("transpose");
    PERMUTE = new("permute");
    EXPAND = new("expand");
    NARROW = new("narrow");
    SELECT = new("select");
    UNSQUEEZE = new("unsqueeze");
    SQUEEZE = new("squeeze");
    CONTIGUOUS = new("contiguous");
    CAT = new("cat");
    SPLIT = new("split");
    STACK = new("stack");
    GATHER = new("gather");
    SCATTER_ADD = new("scatter_add");
    INDEX_SELECT = new("index_select");
    INDEX_ADD = new("index_add");
    INDEX_COPY = new("index_copy");
    EMBEDDING = new("embedding");
    // nn
    SOFTMAX = new("softmax");
    LOG_SOFTMAX = new("log_softmax");
    SOFTMIN = new("softmin");
    LAYER_NORM = new("layer_norm");
    DROPOUT = new("dropout");
    // nn_extra
    PRELU = opaque("prelu");
    BILINEAR = new("bilinear");
    GROUP_NORM = opaque("group_norm");
    CROSS = opaque("cross");
    INDEX_PUT = opaque("index_put");
    TENSORDOT = new("tensordot");
    // batch_norm
    BATCH_NORM = opaque("batch_norm");
    // loss
    MSE = new("mse_loss");
    L1 = new("l1_loss");
    SMOOTH_L1 = new("smooth_l1_loss");
    HUBER = new("huber_loss");
    NLL = new("nll_loss");
    CROSS_ENTROPY = new("cross_entropy");
    BCE = new("binary_cross_entropy");
    BCE_LOGITS = new("binary_cross_entropy_with_logits");
    // loss_extra
    KL_DIV = opaque("kl_div");
    POISSON_NLL = opaque("poisson_nll_loss");
    HINGE_EMBEDDING = opaque("hinge_embedding_loss");
    MARGIN_RANKING = opaque("margin_ranking_loss");
    SOFT_MARGIN = opaque("soft_margin_loss");
    MULTILABEL_MARGIN = new("multilabel_margin_loss");
    MULTILABEL_MARGIN_FORWARD = opaque("multilabel_margin_loss_forward");
    MULTI_MARGIN = opaque("multi_margin_loss");
    COSINE_EMBEDDING = opaque("cosine_embedding_loss");
    TRIPLET_MARGIN = opaque("triplet_margin_loss");
    CTC = opaque("ctc_loss");
    // distance
    NORMALIZE = opaque("normalize");
    RENORM = opaque("renorm");
    COSINE_SIMILARITY = opaque("cosine_similarity");
    PAIRWISE_DISTANCE = opaque("pairwise_distance");
    CDIST = opaque("cdist");
    PDIST = opaque("pdist");
    DIST = opaque("dist");
    // pool
    CONSTANT_PAD = new("constant_pad_nd");
    CIRCULAR_PAD = new("_pad_circular");
    GRID_SAMPLE = new("grid_sample");
    // linalg
    TRACE = opaque("trace");
    INVERSE = new("inverse");
    LINALG_INV = new("linalg_inv");
    LINALG_INV_EX = new("linalg_inv_ex");
    LINALG_SOLVE = new("linalg_solve");
    SOLVE = new("solve");
    LINALG_SOLVE_TRIANGULAR = new("linalg_solve_triangular");
    TRIANGULAR_SOLVE = new("triangular_solve");
    LINALG_CHOLESKY = new("linalg_cholesky");
    LINALG_CHOLESKY_EX = new("linalg_cholesky_ex");
    CHOLESKY = new("cholesky");
    CHOLESKY_SOLVE = new("cholesky_solve");
    CHOLESKY_INVERSE = new("cholesky_inverse");
    LINALG_EIGH = new("linalg_eigh");
    LINALG_EIGVALSH = new("linalg_eigvalsh");
    SYMEIG = new("symeig");
    LINALG_SVD = new("linalg_svd");
    LINALG_SVDVALS = new("linalg_svdvals");
    SVD = new("svd");
    PINVERSE = new("pinverse");
    LINALG_QR = new("linalg_qr");
    QR = new("qr");
    LU_WITH_INFO = new("_lu_with_info");
    LU_SOLVE = opaque("lu_solve");
    LINALG_LSTSQ = opaque("linalg_lstsq");
    LSTSQ = opaque("lstsq");
    LINALG_MATRIX_NORM = opaque("linalg_matrix_norm");
    LINALG_COND = opaque("linalg_cond");
    LINALG_MATRIX_RANK = new("linalg_matrix_rank");
    LINALG_TENSORINV = opaque("linalg_tensorinv");
    LINALG_TENSORSOLVE = opaque("linalg_tensorsolve");
    QUANTILE = new("quantile");
    NANQUANTILE = new("nanquantile");
    GEQRF = new("geqrf");
    LINALG_HOUSEHOLDER_PRODUCT = opaque("linalg_householder_product");
    ORGQR = opaque("orgqr");
    ORMQR = opaque("ormqr");
    FAKE_QUANTIZE = new("fake_quantize_per_tensor_affine");
    // attention
    SDPA = opaque("scaled_dot_product_attention");
    // rnn: PyTorch's CPU cells are composites, their linears autocast
    RNN_CELL = new("RNNCell");
    GRU_CELL = new("GRUCell");
    LSTM_CELL = new("LSTMCell");
    // pointwise
    SOFTPLUS = new("softplus");
    WHERE = new("where");
    CLAMP = new("clamp");
    ADDCMUL = new("addcmul");
    ADDCDIV = new("addcdiv");
    // cast
    TO = new("to");
}

op_families! {
    MAX_POOL = [new("max_pool1d"), new("max_pool2d"), new("max_pool3d")];
    AVG_POOL = [new("avg_pool1d"), new("avg_pool2d"), new("avg_pool3d")];
    ADAPTIVE_AVG_POOL = [new("adaptive_avg_pool1d"), new("adaptive_avg_pool2d"), new("adaptive_avg_pool3d")];
    ADAPTIVE_MAX_POOL = [new("adaptive_max_pool1d"), new("adaptive_max_pool2d"), new("adaptive_max_pool3d")];
    FRACTIONAL_MAX_POOL = [new("fractional_max_pool2d"), new("fractional_max_pool3d")];
    MAX_UNPOOL = [new("max_unpool1d"), new("max_unpool2d"), new("max_unpool3d")];
    REFLECTION_PAD = [new("reflection_pad1d"), new("reflection_pad2d"), new("reflection_pad3d")];
    REPLICATION_PAD = [new("replication_pad1d"), new("replication_pad2d"), new("replication_pad3d")];
}

/// Every op name declared in this crate, each once.
///
/// ```
/// let names: Vec<&str> = amp_autograd::ops::names::all().map(|op| op.name()).collect();
/// assert!(names.contains(&"mm") && names.contains(&"max_pool2d"));
/// ```
pub fn all() -> impl Iterator<Item = &'static OpName> {
    SINGLE
        .iter()
        .copied()
        .chain(FAMILIES.iter().flat_map(|family| family.iter()))
}
